"""The families seqmix converts: one :class:`~seqmix.interop.table.Family` entry each (tables and
adapter configs; the mechanism is in ``adapter.py`` and ``convert.py``), one module per group:

* :mod:`.recurrent`     Mamba, Falcon-Mamba, Mamba-2, RWKV-4, xLSTM
* :mod:`.transformers`  the attention-only models (Llama, Qwen, Mistral, Gemma, Phi, ...) and the
                        attention helpers every group's attention layers share
* :mod:`.hybrids`       RecurrentGemma, Qwen3-Next, Kimi-Linear, MiniMax, LFM2 and the Mamba hybrids

``FAMILIES`` ({config.model_type: Family}) is the one table the converter reads. The adapter configs
read the replaced module's own attributes (the sizes it was built with) and its config, and raise
:class:`~seqmix.interop.table.Unsupported` for what the seqmix mixer cannot express.
"""

from __future__ import annotations

from ..table import Family
from .hybrids import *  # noqa: F401,F403
from .hybrids import HYBRIDS, RECURRENT_GEMMA
from .recurrent import *  # noqa: F401,F403
from .recurrent import RECURRENT
from .transformers import *  # noqa: F401,F403
from .transformers import LLAMA, TRANSFORMERS

FAMILIES: dict[str, Family] = {
    f.model_type: f for f in (*RECURRENT, RECURRENT_GEMMA, LLAMA, *HYBRIDS[1:], *TRANSFORMERS[1:])
}
