"""The conformance matrix: cases declared once, implementations declared once (OpInfo
style), one family of checks per test module, and the tolerances of SPEC.md."""
