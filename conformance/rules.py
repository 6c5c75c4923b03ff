"""The SPEC.md rules a failure can break, by id: what a report groups failures by and quotes.
No torch here: the process that judges a `selgate check` reads them."""

# The SPEC.md rule a failure breaks: its id (what a report groups by) and where SPEC.md says it.
RULES = {
    "shapes": "Shapes: each output has its shape, its dtype and q's device",
    "finite": "Numerics: NaN or inf where the reference is finite is always a failure",
    "accuracy": "Numerics: max and mean abs error within the acceptance bound",
    "empty-rows": "The function: a row that selects nothing gives o = 0 exactly, lse = -inf, no gradient",
    "unselected-keys": "The function: keys that no row selected get exactly zero dk and dv",
    "gradients": "The function: dq, dk, dv are the exact derivatives",
    "inputs-unchanged": "The function: a call computes o from q, k, v and ranges, and writes none of them",
    "ranges": "Ranges: int32 and int64 ranges are one function; a group's heads share its ranges",
    "determinism": "Numerics: bitwise-identical o, lse, dq, dk, dv across runs",
    "bad-input": "Bad input: refused before any kernel runs, naming the argument",
}
