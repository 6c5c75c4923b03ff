"""What an outside kernel declares about itself, read from attributes on its callable or
from a YAML file (`--declare`), validated so that a typo is an error rather than a
capability silently ignored. The keys (defaults in brackets):

- `dtypes` [fp16, bf16, fp32]: torch dtypes or their names; fp64 adds the gradcheck family.
- `devices` [cpu, cuda]; `min_capability` [none], e.g. "9.0".
- `modes` [decode, prefill]; `varlen` [none]: a callable, or `package.module:callable` in
  YAML, `(q, k, v, ranges, cu_seqlens_q, cu_seqlens_k, *, scale=None)`, adding mode varlen.
- `lse` [false]: the callable returns `(o, lse)`; `backward` [false]: gradients through
  autograd; `deterministic` [true]: repeated runs are bitwise identical.
- `head_dim_multiple` [1], `min_head_dim` [1], `max_head_dim` [none]; `same_head_dims`
  [false]: Dv must equal Dk (a case with Dv != Dk is a declared skip).
- `fp32_matmul` [ieee]: `tf32` when the kernel computes fp32 inputs with TF32 matmuls; its
  fp32 results are then judged as TF32 (SPEC.md: the fp16 rule with eps 2^-10), never assumed.
- heads per group: `heads_multiple_of` [1], `heads_power_of_two` [false], `min_heads` [1],
  `max_heads` [none]. The matrix fits each case's heads per group to the smallest count
  the kernel takes, so a constrained kernel still meets every shape's other dimensions.
- `block_size` [none]: the kernel selects whole blocks of this many keys (NSA's l_sel), at
  most 128; the matrix then generates block-aligned selections (the block holding `t`
  partial), and the verdict's first line names the block size.
- `layouts` [contiguous, strided, kv_shared]: input layouts taken; without `strided` the
  matrix hands over contiguous copies and skips its strided and shared-buffer checks.
- `max_size` [large]: the largest case size class.
- `xfail` (YAML only) [none]: expected failures, strict: a list of `{family, cases, reason}`
  where `cases` is an fnmatch pattern on the case id (or the bad input's name).

`supports_lse` and `supports_backward` are accepted as the older names of `lse` and
`backward`.
"""

from __future__ import annotations

import importlib
import types
from pathlib import Path

from selgate import strict_yaml
from selgate.cli_args import spec_problem

# A declared dtype by its name (the one the matrix and the report use) or torch's; declarations
# hold names, so the process that judges a kernel reads them without importing torch.
DTYPES = {
    "fp16": "fp16",
    "float16": "fp16",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp32": "fp32",
    "float32": "fp32",
    "fp64": "fp64",
    "float64": "fp64",
}
MODES = ("decode", "prefill")
DEVICES = ("cpu", "cuda")
LAYOUTS = ("contiguous", "strided", "kv_shared")
FP32_MATMULS = ("ieee", "tf32")
ALIASES = {"supports_lse": "lse", "supports_backward": "backward"}
XFAIL_KEYS = ("family", "cases", "reason")


def load_callable(spec: str, what: str = "--impl"):
    """`package.module:callable` (dotted attribute path allowed) imported and checked."""
    problem = spec_problem(str(spec), what)
    if problem:
        raise ValueError(problem)
    mod_name, _, attr = str(spec).partition(":")
    try:
        fn = importlib.import_module(mod_name)
        for part in attr.split("."):
            fn = getattr(fn, part)
    except (ImportError, AttributeError) as e:
        raise type(e)(f"{what} {spec}: {e}") from e
    if not callable(fn):
        raise TypeError(f"{what} {spec}: {type(fn).__name__} is not callable")
    return fn


def _seq(value, where, allowed=None, convert=None):
    items = [value] if isinstance(value, str) or _is_torch_dtype(value) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise ValueError(f"{where}: expected a non-empty list, got {value!r}")
    out = []
    for x in items:
        if convert is not None:
            x = convert(x, where)
        elif allowed is not None and x not in allowed:
            raise ValueError(f"{where}: {x!r} is not one of {list(allowed)}")
        out.append(x)
    return tuple(out)


def _is_torch_dtype(x) -> bool:
    """`torch.float16` and its kind, told without importing torch."""
    return type(x).__name__ == "dtype" and type(x).__module__ == "torch"


def _dtype(x, where):
    """The name of a dtype declared by name or as a torch dtype (read by its text)."""
    text = x if isinstance(x, str) else str(x).removeprefix("torch.") if _is_torch_dtype(x) else None
    if text in DTYPES:
        return DTYPES[text]
    raise ValueError(f"{where}: {x!r} is not a torch dtype or one of {sorted(DTYPES)}")


def _int(value, where, minimum=1, maximum=None):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
        raise ValueError(f"{where}: expected an integer {bound}, got {value!r}")
    return value


def _bool(value, where):
    if not isinstance(value, bool):
        raise ValueError(f"{where}: expected true or false, got {value!r}")
    return value


def _capability(value, where):
    parts = str(value).split(".")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise ValueError(f'{where}: expected a compute capability such as "9.0", got {value!r}')
    return str(value)


def _varlen(value, where):
    return (
        load_callable(value, where)
        if isinstance(value, str)
        else value
        if callable(value)
        else _fail(where, f"expected a callable or 'package.module:callable', got {value!r}")
    )


def _fail(where, what):
    raise ValueError(f"{where}: {what}")


def _xfails(value, where):
    from .families import FAMILIES

    if not isinstance(value, list):
        raise ValueError(f"{where}: expected a list of {{family, cases, reason}}, got {value!r}")
    families = list(FAMILIES)
    out = []
    for i, entry in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(entry, dict) or set(entry) != set(XFAIL_KEYS):
            raise ValueError(f"{at}: expected exactly the keys {list(XFAIL_KEYS)}, got {entry!r}")
        if entry["family"] not in families:
            raise ValueError(f"{at}.family: {entry['family']!r} is not one of {families}")
        if not str(entry["reason"]).strip() or not str(entry["cases"]).strip():
            raise ValueError(f"{at}: cases and reason must be non-empty")
        out.append((entry["family"], str(entry["cases"]), str(entry["reason"])))
    return tuple(out)


def _fp32_matmul(value, where):
    if value not in FP32_MATMULS:
        raise ValueError(f"{where}: expected one of {list(FP32_MATMULS)}, got {value!r}")
    return value


def _sizes(value, where):
    from .sizes import SIZES

    if value not in SIZES:
        raise ValueError(f"{where}: expected one of {SIZES}, got {value!r}")
    return value


# key -> parser(value, where) giving the Impl field's value
PARSERS = {
    "dtypes": lambda v, w: _seq(v, w, convert=_dtype),
    "devices": lambda v, w: _seq(v, w, DEVICES),
    "modes": lambda v, w: _seq(v, w, MODES),
    "varlen": _varlen,
    "lse": _bool,
    "backward": _bool,
    "deterministic": _bool,
    "head_dim_multiple": _int,
    "min_head_dim": _int,
    "max_head_dim": _int,
    "same_head_dims": _bool,
    "fp32_matmul": _fp32_matmul,
    "min_capability": _capability,
    "heads_multiple_of": _int,
    "heads_power_of_two": _bool,
    "min_heads": _int,
    "max_heads": _int,
    "block_size": lambda v, w: _int(v, w, maximum=MAX_BLOCK_SIZE),
    "layouts": lambda v, w: _seq(v, w, LAYOUTS),
    "max_size": _sizes,
    "xfail": _xfails,
}


# The largest selection block a kernel may declare: NSA's l_sel is 64, and no kernel we know
# selects blocks over 128 keys. A larger one widens every range of the small cases to the whole
# causal prefix, so no case would test where a selection lies.
MAX_BLOCK_SIZE = 128
MAX_HEADS = 256  # the most heads per group a case is fitted to (the widest NSA configurations use 64)


def parse(mapping: dict, where: str) -> dict:
    """Validated declarations keyed by their canonical names; ValueError names an unknown
    key or a bad value."""
    out = {}
    for key, value in mapping.items():
        name = ALIASES.get(key, key)
        if name not in PARSERS:
            raise ValueError(f"{where}: unknown declaration {key!r}; known: {sorted([*PARSERS, *ALIASES])}")
        if name in out:
            raise ValueError(f"{where}: {key!r} declared twice (as {name!r})")
        out[name] = PARSERS[name](value, f"{where}.{key}")
    if "max_heads" in out and out["max_heads"] < out.get("min_heads", 1):
        raise ValueError(f"{where}: max_heads {out['max_heads']} is below min_heads {out.get('min_heads', 1)}")
    heads = {k: out[k] for k in ("heads_multiple_of", "heads_power_of_two", "min_heads", "max_heads") if k in out}
    if heads:
        fewest = allowed_heads(
            1,
            multiple_of=heads.get("heads_multiple_of", 1),
            power_of_two=heads.get("heads_power_of_two", False),
            minimum=heads.get("min_heads", 1),
            maximum=heads.get("max_heads"),
        )
        if fewest is None or fewest > MAX_HEADS:
            need = "no count satisfies them" if fewest is None else f"the fewest they allow is {fewest}"
            raise ValueError(f"{where}: heads per group {heads}: {need}; the matrix runs 1 to {MAX_HEADS} heads a group")
    return out


def from_callable(fn, spec: str, what: str = "--impl") -> dict:
    """Declarations set as attributes on a plain function (`fn.dtypes = ...`). Every
    public attribute of a function is taken as one, so a misspelt one is an error."""
    if isinstance(fn, types.FunctionType):
        attrs = {k: v for k, v in vars(fn).items() if not k.startswith("_")}
    else:  # a class instance or a JIT wrapper has attributes of its own: read only known keys
        attrs = {k: getattr(fn, k) for k in (*PARSERS, *ALIASES) if k != "xfail" and hasattr(fn, k)}
    if "xfail" in attrs:
        raise ValueError(f"{what} {spec}: expected failures go in a --declare file, not on the callable")
    return parse(attrs, f"{what} {spec}")


def from_yaml(path) -> dict:
    """Declarations from a YAML mapping (a `--declare` file)."""
    return parse(_read_yaml(path), f"--declare {path}")


def file_json(path) -> dict:
    """A `--declare` file's declarations in `to_json`'s form, read without importing anything
    (a varlen callable by its presence): what `selgate check`'s judge lays over the probe's
    declarations key by key, as `load_user_impl` does, since the probe's copy of them is written
    in the kernel's own process."""
    data = _read_yaml(path)
    varlen = data.pop("varlen", None)
    out = to_json(parse(data, f"--declare {path}"))
    if varlen is not None:
        out["varlen"] = True
    return out


def _read_yaml(path) -> dict:
    """A `--declare` file read strictly (`strict_yaml`): a key given twice is an error, not the
    last one silently winning (a file that declared fp16 and then fp32 alone passed a kernel whose
    fp16 was NaN, its table saying fp32)."""
    path = Path(path)
    try:
        data = strict_yaml.load(path).data
    except OSError as e:
        raise OSError(f"--declare {path}: {e.strerror}") from None
    except strict_yaml.PolicyError as e:
        raise ValueError(f"--declare {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"--declare {path}: expected a mapping of declarations, got {type(data).__name__}")
    return data


def to_json(declared: dict) -> dict:
    """Validated declarations as JSON values, for the process that judges a kernel without
    importing it and the workers it hands them to: dtypes by name, a varlen callable by its
    presence (the probe writes where it imports from: `varlen_source`), tuples as lists."""
    out = {}
    for key, value in declared.items():
        if key == "varlen":
            value = True
        elif key == "xfail":
            value = [dict(zip(XFAIL_KEYS, x)) for x in value]
        elif isinstance(value, tuple):
            value = [list(x) if isinstance(x, tuple) else x for x in value]
        out[key] = value
    return out


def varlen_source(spec: str, declare=None) -> str:
    """Where a declared varlen callable imports from in another process: the `--declare`
    file's `package.module:callable` (which wins over an attribute), else `spec`'s own
    `varlen` attribute (`package.module:fn.varlen`)."""
    if declare:
        data = _read_yaml(declare)
        if "varlen" in data and isinstance(data["varlen"], str):
            return data["varlen"]
    return f"{spec}.varlen"


def from_json(data: dict, varlen) -> dict:
    """The declarations `to_json` wrote, validated again as a declaration file is (they come from
    the kernel's own process, which may have rewritten them: a key that is no declaration, such
    as an Impl field that would drop whole families, is an error), with `varlen` standing for
    the callable."""
    out = parse({k: v for k, v in data.items() if k != "varlen"}, "the probe's declarations")
    if "varlen" in data:
        out["varlen"] = varlen
    return out


def allowed_heads(
    h: int, *, multiple_of: int = 1, power_of_two: bool = False, minimum: int = 1, maximum: int | None = None
) -> int | None:
    """The smallest heads-per-group count >= h the constraints allow, one that is not a power of
    two where h is not and the constraints allow one (a multiple of 16 fits h = 3 to 48, not 16:
    a head index by shift is wrong at 48); None if none does."""
    start = max(h, minimum, 1)
    if h & (h - 1) and not power_of_two:
        odd = -(-start // multiple_of) * multiple_of
        while odd & (odd - 1) == 0:
            odd += multiple_of
        if odd <= min(maximum or MAX_HEADS, MAX_HEADS):
            return odd
    if power_of_two:
        if multiple_of & (multiple_of - 1):  # no power of two is a multiple of it
            return None
        n = max(multiple_of, 1 << (start - 1).bit_length())
    else:
        n = -(-start // multiple_of) * multiple_of
    return n if maximum is None or n <= maximum else None
