"""The golden reference of SPEC.md, range handling and input validation."""

from .builder import build_ranges, compressed_to_selection_scores
from .golden import selection_attention_ref
from .ranges import RangeError, expand_ranges, normalize_ranges, query_positions, selected_keys, selected_lengths, validate_ranges
from .validation import Dims, check_inputs, resolve_scale
from .varlen import pack_sequences, unpack_sequences, varlen_to_batched

__all__ = [
    "Dims",
    "RangeError",
    "build_ranges",
    "check_inputs",
    "compressed_to_selection_scores",
    "expand_ranges",
    "normalize_ranges",
    "pack_sequences",
    "query_positions",
    "resolve_scale",
    "selected_keys",
    "selected_lengths",
    "selection_attention_ref",
    "unpack_sequences",
    "validate_ranges",
    "varlen_to_batched",
]
