"""Backend choice: auto -> hf without CUDA, unsloth without a GPU is an error, never a fallback."""

import pytest
import torch

from rlkit import backends
from rlkit.errors import UserError

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks CPU-machine behaviour")


def test_auto_picks_hf_without_cuda(caplog):
    backends._chosen.clear()
    with caplog.at_level("INFO", logger="rlkit"):
        assert backends.choose("auto") == "hf"
    assert "backend auto -> hf (no CUDA GPU)" in caplog.text


def test_unsloth_without_gpu_is_a_clear_error():
    backends._chosen.clear()
    with pytest.raises(UserError, match="unsloth needs a CUDA GPU and this machine has none"):
        backends.choose("unsloth")
    # validation stays possible on a laptop: the import-order guard never raises
    backends.import_unsloth_first("unsloth")


@pytest.mark.gpu
def test_unsloth_backend_loads_on_gpu():
    backends._chosen.clear()
    assert backends.choose("unsloth") == "unsloth"
