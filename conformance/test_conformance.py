"""The conformance matrix: every family's tests, made from its declaration in
selgate.conformance.families (`test_<family>` over implementation x case, parametrized by the
plugin; policy's own tests)."""

from selgate.conformance.families import all_tests

globals().update(all_tests())
