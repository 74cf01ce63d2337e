"""attention_jax: Transformer self-attention in JAX and Flax, as pure functions and modules.

Depends only on jax, flax, chex and numpy.
"""

from attention_jax import diagnostics
from attention_jax import hooks
from attention_jax import variants
from attention_jax.attention import IMPLEMENTATIONS
from attention_jax.attention import dot_product_attention
from attention_jax.attention import select_implementation
from attention_jax.attention import structure_mask
from attention_jax.block_masks import BlockMask
from attention_jax.block_masks import make_block_mask
from attention_jax.chunked import chunked_attention
from attention_jax.context_parallel import ContextParallel
from attention_jax.context_parallel import context_parallel_attention
from attention_jax.context_parallel import context_parallel_attention_shard
from attention_jax.context_parallel import from_zigzag
from attention_jax.context_parallel import to_zigzag
from attention_jax.context_parallel import zigzag_order
from attention_jax.encoder import EncoderBlock
from attention_jax.encoder import EncoderConfig
from attention_jax.encoder import SequenceClassifier
from attention_jax.encoder import TokenClassifier
from attention_jax.encoder import TransformerEncoder
from attention_jax.hooks import capture
from attention_jax.hooks import patch
from attention_jax.masks import causal_mask
from attention_jax.masks import combine_masks
from attention_jax.masks import lengths_to_valid
from attention_jax.masks import local_window_mask
from attention_jax.masks import padding_mask
from attention_jax.masks import segment_mask
from attention_jax.masks import seq_lengths_mask
from attention_jax.masks import tokens_to_valid
from attention_jax.mods import and_masks
from attention_jax.mods import create_mask
from attention_jax.mods import noop_mask
from attention_jax.mods import or_masks
from attention_jax.multihead import SCALES
from attention_jax.multihead import MultiHeadAttention
from attention_jax.multihead import MultiHeadDotProductAttention
from attention_jax.multihead import SelfAttention
from attention_jax.multihead import attention_maps
from attention_jax.multihead import multi_head_attention
from attention_jax.multihead import multi_head_attention_logits
from attention_jax.multihead import multi_head_attention_weights
from attention_jax.multihead import qk_layer_norm
from attention_jax.multihead import resolve_scale
from attention_jax.positional import POSITIONAL_ENCODINGS
from attention_jax.positional import alibi_bias
from attention_jax.positional import apply_rope
from attention_jax.positional import positional_encoding
from attention_jax.positional import randomized_positions
from attention_jax.positional import sinusoidal_encoding
from attention_jax.reference import attention_weights

__version__ = "0.1.0"


def __getattr__(name):
  """attention_jax.nnx (the NNX shells) is imported on first use, so that importing the package
  does not import flax.nnx for Linen and pure-function users."""
  if name == "nnx":
    import importlib
    return importlib.import_module("attention_jax.nnx")
  raise AttributeError(f"module 'attention_jax' has no attribute {name!r}")
