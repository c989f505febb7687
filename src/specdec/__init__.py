"""specdec: exact speculative decoding.

>>> from specdec import Engine, SamplingParams, SpecConfig       # doctest: +SKIP
>>> engine = Engine(target=HFModel(target_model), drafter=ModelDrafter(HFModel(draft_model)))
>>> params = SamplingParams(max_tokens=64, temperature=0.0)
>>> out = engine.generate(prompt_ids, params, SpecConfig(k=4))
"""

from specdec.config import SamplingParams, SpecConfig
from specdec.engine import Chunk, Engine, Output
from specdec.metrics import SpecStats

__all__ = ["Chunk", "Engine", "Output", "SamplingParams", "SpecConfig", "SpecStats"]
__version__ = "0.1.0"
