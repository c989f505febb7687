#!/usr/bin/env bash
# Export the catalog's default pair to OpenVINO IR with INT4 weights, once, for the
# openvino-int4 and openvino-int4-model bench systems.
#
# Why a separate environment: optimum-intel and nncf (the exporter) would replace this
# project's pinned torch; here they get their own venv under the cache, with torch 2.13.0
# pinned and torchvision removed (its wheel breaks transformers' import under that torch).
# The float32 models must be in the cache already (any first `specdec generate` builds them).
set -euo pipefail
cache="${SPECDEC_CACHE:-$HOME/.cache/specdec}"
venv="$cache/openvino/export-venv"
if [ ! -x "$venv/bin/optimum-cli" ]; then
  python -m venv "$venv"
  "$venv/bin/pip" install -q torch==2.13.0 'optimum-intel[openvino]==2.2.0' nncf==3.4.0
  "$venv/bin/pip" uninstall -y -q torchvision || true
fi
for name in qwen2.5-coder-1.5b-instruct qwen2.5-coder-0.5b-instruct; do
  source="$cache/hf/$name"
  out="$cache/openvino/$name-int4"
  [ -f "$source/config.json" ] || { echo "missing $source: run specdec generate once first" >&2; exit 2; }
  [ -f "$out/openvino_model.xml" ] && { echo "$out: already exported"; continue; }
  started=$(date +%s)
  "$venv/bin/optimum-cli" export openvino --model "$source" --task text-generation-with-past \
    --weight-format int4 "$out.building" > "$out.log" 2>&1
  rm -rf "$out" && mv "$out.building" "$out"
  echo "$out: exported in $(( $(date +%s) - started )) s"
done
