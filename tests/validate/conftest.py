import pytest
import torch

from real.engine import EngineConfig
from real.profile import ProfileConfig
from real.tiny import TinyModelsConfig, tiny_engine

ECFG = EngineConfig(
    k_max=6, max_len=128, target_dtype="float64", drafter_dtype="float64", stop_at_eot=False
)
PCFG = ProfileConfig(
    contexts=(8, 40),
    prefill_tokens=(12, 24),
    warmup=1,
    repeats=2,
    overhead_prompts=1,
    overhead_tokens=12,
)


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def engine():
    torch.set_num_threads(1)
    return tiny_engine(TinyModelsConfig(), ECFG)
