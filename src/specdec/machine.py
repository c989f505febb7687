"""Facts of this machine's CPU, read once from /proc/cpuinfo: its name, its kind and the
features that decide which kernels run. Every speed figure names them."""

from __future__ import annotations

import functools
import platform


@functools.cache
def cpuinfo() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo ({} where there is none): one read for
    the name, kind and flags below."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if not line.strip():
                    break  # the end of the first processor
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_name() -> str:
    return cpuinfo().get("model name") or platform.processor() or "unknown CPU"


def cpu_kind() -> str:
    """The CPU's family and model ("family 25 model 17"; "" where /proc/cpuinfo does not
    say): CPUs of one name can be different kinds (the AVX2 and the AVX-512 AMD EPYC)."""
    fields = cpuinfo()
    if "cpu family" in fields and "model" in fields:
        return f"family {fields['cpu family']} model {fields['model']}"
    return ""


def cpu_flag_set() -> set[str]:
    """Every feature flag of the CPU (empty where /proc/cpuinfo does not say)."""
    return set(cpuinfo().get("flags", "").split())


def cpu_flags() -> list[str]:
    """The SIMD features that decide which kernels run."""
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8")
    flags = cpu_flag_set()
    return [flag for flag in wanted if flag in flags]
