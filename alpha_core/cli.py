"""`alpha` command line: the same functions the Dagster assets call, usable without Dagster.

One language for every command:
- Folders. `--data-dir` is the data root (one folder per symbol, as `alpha demo-data` writes it) or one symbol's
  folder; alpha tells them apart: a folder named for a symbol (`ES.FUT`, or a schema folder in it such as
  `ES.FUT/mbp-10`) is that symbol's, a folder holding symbol folders is a root, any other folder holds one
  product's files. Under a root, `--symbol` picks the folder (needed when the root holds several). The sidecar
  cache `--predecoded-dir` follows the same rule: a root gets one folder per symbol, a folder named for a symbol
  is that symbol's. A folder a command writes is `--output-dir`, a file `--output`.
- Symbols. `--symbol` is one product, `--symbols` a comma-separated list; `ES`, `es` and `ES.FUT` all name
  ES.FUT; an unknown symbol is refused before any work.
- Options are spelled out (no prefixes). The options of the training, hyperopt and evaluation commands are
  generated from their pydantic configs, so each default is written once (in the config) and `--help` shows it;
  building them imports no torch (the configs live in light `configs` modules).
- Exit codes: 0 done, 1 the work failed (unexpected errors, nothing evaluated, failed runs or integrity
  checks), 2 bad input or usage. Errors are one line on stderr (a usage error: the command's usage line and
  the error); `--debug` (or ALPHA_DEBUG=1) re-raises with the traceback. Output paths are checked before any
  work starts.
"""

from __future__ import annotations

import argparse
import datetime as dt
import difflib
import errno
import json
import os
import re
import sys
import types
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Literal, Union, get_args, get_origin

import alpha_core
from alpha_core.argparse_private import actions, is_subcommands
from alpha_core.errors import DataError, FetchError, PlanError, describe_validation_error
from alpha_core.processes import stop_group, stop_on_signals


def _iso(ts_ns: int | None) -> str | None:
    return None if ts_ns is None else dt.datetime.fromtimestamp(ts_ns / 1e9, tz=dt.UTC).isoformat()


def _given(args: argparse.Namespace, *skip: str) -> dict:
    """The options the user set (absent ones are left to the config's default)."""
    return {k: v for k, v in vars(args).items() if v is not None and k not in ("func", "command", "debug", "quiet", *skip)}


def _symbols(value: str | None) -> list[str] | None:
    return None if not value else [s.strip() for s in value.split(",") if s.strip()]


def _pairs(value: str) -> dict[str, str]:
    """KEY=VALUE[,KEY=VALUE...] (e.g. --hyperopt-results tft=runs/hyperopt/tft/ES.FUT/results.json)."""
    out = {}
    for item in _symbols(value) or []:
        key, sep, val = item.partition("=")
        if not sep or not key.strip() or not val.strip():
            raise argparse.ArgumentTypeError(f"expected KEY=VALUE pairs, got {item!r}")
        out[key.strip()] = val.strip()
    return out


def _int(value: str) -> int:
    """An integer in any Python notation (the original seed is 0x4242)."""
    return int(value, 0)


# --- the parser: no prefixes, two-line usage errors ------------------------------------------------


class Parser(argparse.ArgumentParser):
    """argparse without prefix matching (`--cv-n 3` is an error, not --cv-n-folds), whose usage error is two
    lines: the command's short usage and the error (argparse prints the whole option list first)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.chosen: Parser | None = None  # the top-level parser's command, whose usage an error shows

    def error(self, message: str):
        parser = self.chosen or self  # argparse reports a command's unrecognized arguments from the top level
        self.exit(2, f"{short_usage(parser)}\n{parser.prog}: error: {message}\n")


def short_usage(parser: argparse.ArgumentParser) -> str:
    """`usage: alpha train-supervised --data-dir DATA_DIR ... [options]`: what is required, then a pointer."""
    parts = [parser.prog]
    for action in actions(parser):
        if is_subcommands(action):
            parts.append("COMMAND ...")
        elif not action.option_strings:
            name = action.metavar or action.dest.upper()
            parts.append({"+": f"{name} ...", "*": f"[{name} ...]", "?": f"[{name}]"}.get(action.nargs, name))
        elif action.required:
            parts.append(f"{action.option_strings[0]} {action.metavar or action.dest.upper()}")
    return f"usage: {' '.join(parts)} [options] (--help lists them)"


# --- options generated from a config ---------------------------------------------------------------


def _option_type(annotation) -> tuple[Callable | None, list | None]:
    """argparse `type` and `choices` of a config field (Optional and Annotated unwrapped; lists comma-separated)."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        (inner,) = [a for a in get_args(annotation) if a is not type(None)]
        return _option_type(inner)
    if origin is Annotated:
        return _option_type(get_args(annotation)[0])
    if origin is Literal:
        return str, list(get_args(annotation))
    if origin is list:
        return _symbols, None
    if origin is dict:
        return _pairs, None
    if annotation is dt.date:
        return dt.date.fromisoformat, None
    return (_int if annotation is int else annotation), None


def add_config_options(
    p: argparse.ArgumentParser,
    config: type,
    help: dict[str, str],
    flags: dict[str, Sequence[str]] | None = None,
    skip: Sequence[str] = (),
) -> None:
    """One option per field of `config` but `skip`: its type, choices and whether it is required come from the
    field, and its default is shown in --help but left to the config (an option not given is absent from the
    namespace). A bool defaulting to True becomes `--no-<name>`. `flags` renames options (the first name is shown)."""
    for name, field in config.model_fields.items():
        if name in skip:
            continue
        kind, choices = _option_type(field.annotation)
        default = None if field.is_required() else field.get_default(call_default_factory=True)
        text = help.get(name, "")
        if kind is bool and default is None:  # unset: the config decides (e.g. on for cuda); --x / --no-x force it
            p.add_argument(
                *((flags or {}).get(name) or [f"--{name.replace('_', '-')}"]),
                dest=name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=text or None,
            )
            continue
        if kind is bool:
            names = (flags or {}).get(name) or [f"--{'no-' if default else ''}{name.replace('_', '-')}"]
            p.add_argument(
                *names,
                dest=name,
                action="store_false" if default else "store_true",
                default=argparse.SUPPRESS,
                help=text or None,
            )
            continue
        if default is not None and "default:" not in text:
            text = f"{text} (default: {default})" if text else f"default: {default}"
        names = (flags or {}).get(name) or [f"--{name.replace('_', '-')}"]
        p.add_argument(
            *names,
            dest=name,
            type=kind,
            choices=choices,
            required=field.is_required(),
            default=argparse.SUPPRESS,
            help=text or None,
            metavar=None if choices else names[0][2:].upper().replace("-", "_"),
        )


def _default_of(func: Callable, name: str):
    """A function's own default, so an option of a command without a config still writes it once."""
    import inspect

    return inspect.signature(func).parameters[name].default


def _source_literals(module: str, function: str, table: str) -> tuple[dict, list[str]]:
    """(`function`'s literal defaults, the names `table` is built from) of `module`, read from its source without
    importing it: `alpha demo-data --help` then costs no scipy (a second of CPU). The names are the first string
    argument of each call in the table's definition (`DemoScale("tiny", ...)`)."""
    import ast
    import importlib.util

    tree = ast.parse(Path(importlib.util.find_spec(module).origin).read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)
    positional = [*fn.args.posonlyargs, *fn.args.args]
    pairs = [
        *zip(positional[len(positional) - len(fn.args.defaults) :], fn.args.defaults, strict=True),
        *((a, d) for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults, strict=True) if d is not None),
    ]
    defaults = {}
    for arg, node in pairs:
        try:
            defaults[arg.arg] = ast.literal_eval(node)
        except ValueError:
            continue  # not a literal (e.g. tuple(PRODUCTS)): not shown
    assignment = next(
        n
        for n in tree.body
        if isinstance(n, ast.Assign | ast.AnnAssign)
        and table in [t.id for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)]
    )
    try:  # a literal tuple of names (`SPLITS = ("quarterly", ...)`)
        return defaults, [str(n) for n in ast.literal_eval(assignment.value)]
    except ValueError:
        pass
    names = [
        call.args[0].value
        for call in ast.walk(assignment)
        if isinstance(call, ast.Call)
        and call.args
        and isinstance(call.args[0], ast.Constant)
        and isinstance(call.args[0].value, str)
    ]
    return defaults, names


# --- folders and symbols: one meaning each (module docstring) --------------------------------------

SCHEMA_FOLDERS = ("mbp-10", "ohlcv-1m")  # a symbol folder's schema folders, as `alpha demo-data` writes them
ONE_SYMBOL = ("folds", "train", "train-supervised", "train-rl", "hyperopt")  # commands of one symbol's data


def normalise_symbol(value: str) -> str:
    """ES, es, ES.FUT -> ES.FUT; an unknown symbol is an error listing the known ones."""
    from alpha_core.data.products import product

    return product(value.strip().upper()).symbol


def check_symbols(args: argparse.Namespace) -> None:
    """Every --symbol/--symbols names known products, written as their parent symbol (never a second `ES/`)."""
    if getattr(args, "symbol", None) is not None:
        args.symbol = normalise_symbol(args.symbol)
    if getattr(args, "symbols", None) is not None:
        args.symbols = list(dict.fromkeys(normalise_symbol(s) for s in args.symbols)) or None


def _named_symbol(path: Path, schema_folder: bool = False) -> str | None:
    """The symbol a folder is named for (`.../ES.FUT`; with `schema_folder`, also `.../ES.FUT/mbp-10`)."""
    from alpha_core.data.products import PRODUCTS

    if path.name in PRODUCTS:
        return path.name
    if schema_folder and path.name in SCHEMA_FOLDERS and path.parent.name in PRODUCTS:
        return path.parent.name
    return None


def _symbol_folders(root: Path) -> list[str]:
    from alpha_core.data.products import PRODUCTS

    return sorted(p.name for p in root.glob("*") if p.name in PRODUCTS and p.is_dir())


def _agree(path: Path, named: str, symbols: str | list[str] | None, flag: str) -> None:
    """A folder named for a symbol is that symbol's: --symbol/--symbols naming another is a contradiction."""
    asked = [symbols] if isinstance(symbols, str) else symbols or []
    if asked and asked != [named]:
        raise PlanError(f"{path} is {named}'s folder, but {flag} is {','.join(asked)}")


def symbol_data_dir(data_dir: Path, symbol: str | None) -> tuple[Path, str | None]:
    """(the folder of one symbol's files, that symbol when known) from --data-dir and --symbol."""
    from alpha_core.data.predecode import symbol_dir

    named = _named_symbol(data_dir, schema_folder=True)
    if named is not None:
        _agree(data_dir, named, symbol, "--symbol")
        return data_dir, named
    present = _symbol_folders(data_dir)
    if not present:  # a folder of one product's files
        return data_dir, symbol
    if symbol is None:
        if len(present) > 1:
            raise PlanError(f"{data_dir} is a data root with {', '.join(present)}: choose one with --symbol")
        symbol = present[0]
    return symbol_dir(data_dir, symbol), symbol


def symbol_cache_dir(cache: Path, symbol: str | None) -> Path:
    """One symbol's sidecar folder from --predecoded-dir: a root gets the symbol's folder, as `alpha predecode`
    and Dagster lay it out; a folder named for a symbol (or any folder, the symbol unknown) is used as given."""
    named = _named_symbol(cache)
    if named is not None:
        _agree(cache, named, symbol, "the symbol")
        return cache
    return cache / symbol if symbol else cache


def resolve_one_symbol(args: argparse.Namespace) -> None:
    """The folders of a one-symbol command: the symbol's data folder, its symbol, and its sidecar folder (by
    default under $ALPHA_STORAGE_ROOT/predecoded when that is set, as Dagster's)."""
    key = "mbp10_data_dir" if args.command == "train" else "data_dir"
    folder, symbol = symbol_data_dir(Path(getattr(args, key)), getattr(args, "symbol", None))
    setattr(args, key, folder)
    args.symbol = symbol
    cache = getattr(args, "predecoded_dir", None)
    if cache is None and args.command != "folds" and os.environ.get("ALPHA_STORAGE_ROOT"):
        cache = Path(os.environ["ALPHA_STORAGE_ROOT"], "predecoded")
    if cache is not None:
        args.predecoded_dir = symbol_cache_dir(Path(cache), symbol)


# --- checks before any work ------------------------------------------------------------------------

OUTPUT_DIRS = ("out", "output_dir", "predecoded_dir")  # options naming a folder the command writes into
OUTPUT_FILES = ("output", "kernel_step_trace")  # options naming a file the command writes


def _outputs(args: argparse.Namespace) -> Iterator[tuple[Path, bool]]:
    """(path, is a directory) of every output option given."""
    for names, is_dir in ((OUTPUT_DIRS, True), (OUTPUT_FILES, False)):
        for name in names:
            if getattr(args, name, None) is not None and not (name == "predecoded_dir" and args.command == "folds"):
                yield Path(getattr(args, name)), is_dir


STORAGE_WRITERS = ("train", "train-supervised", "train-rl", "predecode", "hyperopt", "evaluate")


def storage_roots(args: argparse.Namespace) -> list[Path]:
    """The folders a command writes alpha's artifacts into, as given (before a symbol's folder is picked): they get
    the marker that lets `alpha clean` clean them (`alpha_core.cleanup.mark_storage_root`)."""
    if args.command not in STORAGE_WRITERS:
        return []
    roots = [Path(getattr(args, name)) for name in OUTPUT_DIRS if getattr(args, name, None) is not None]
    if getattr(args, "predecoded_dir", None) is None and os.environ.get("ALPHA_STORAGE_ROOT"):
        roots.append(Path(os.environ["ALPHA_STORAGE_ROOT"]))  # the default sidecar cache's root
    return roots


def mark_storage_roots(roots: list[Path]) -> None:
    """Mark the roots a command wrote into (a folder it left empty, or never made, stays unmarked: nothing partial)."""
    from alpha_core.cleanup import STORAGE_MARKER, mark_storage_root

    for root in roots:
        try:
            if root.is_dir() and any(p.name != STORAGE_MARKER for p in root.iterdir()):
                mark_storage_root(root)
        except OSError:
            pass  # a full or read-only volume: the command's own error (if any) is the one to show


def check_output_path(path: Path, is_dir: bool) -> None:
    """An output must be (or be creatable as) a directory or a file where this process may write."""
    if is_dir and path.exists() and not path.is_dir():
        raise DataError(path, "exists and is not a directory")
    if not is_dir and path.is_dir():
        raise DataError(path, "is a directory; expected a file name")
    for where in (path.parent, path) if is_dir else (path.parent,):
        existing = next((p for p in (where, *where.parents) if p.exists()), Path.cwd())
        if not existing.is_dir():
            raise DataError(path, f"cannot be created: {existing} is not a directory")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise DataError(path, f"cannot be written: {existing} is not writable (permission denied or read-only)")


# --- errors: one line each -------------------------------------------------------------------------

# what a full disk looks like from Python (ENOSPC), numpy ("9831 requested and 8160 written") and Rust
# libraries such as safetensors ("IoError(Os { code: 28, kind: StorageFull, ... })")
_NO_SPACE = re.compile(r"no space left|storagefull|code: 28\b|\d+ requested and \d+ written|quota exceeded", re.I)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def describe_error(exc: Exception, args: argparse.Namespace) -> tuple[int, str]:
    """(exit code, one-line message) for an exception that reached the command line."""
    core = sys.modules.get("pydantic_core")  # not imported here: the error path must not load libraries (out of memory)
    if core is not None and isinstance(exc, core.ValidationError):
        return 2, describe_validation_error(exc)
    if isinstance(exc, DataError | PlanError):
        return 2, _one_line(exc)
    if isinstance(exc, FetchError):  # the work failed, in one line that already names what
        return 1, _one_line(exc)
    chain = list(_chain(exc))
    os_errors = [e for e in chain if isinstance(e, OSError)]
    named = next((Path(e.filename) for e in os_errors if e.filename), None)
    if any(isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) or _NO_SPACE.search(str(e)) for e in chain):
        # no file named: the command's own output (--output, --output-dir) before the sidecar cache it may also fill
        outputs = sorted(_outputs(args), key=lambda o: o[0] == getattr(args, "predecoded_dir", None))
        path = named or next((p for p, _ in outputs), None)
        return 2, f"{path or 'output'}: no space left on device ({_one_line(exc)})"
    if os_errors:
        e = os_errors[0]
        reason = (e.strerror or _one_line(e)).lower()
        return 2, f"{named}: {reason}" if named else reason
    return 1, f"{type(exc).__name__}: {_one_line(exc)} (run with --debug for the traceback)"


# --- inspect ---------------------------------------------------------------------------------------


def cmd_inspect(args: argparse.Namespace) -> int:
    """Describe each file: any valid DBN file is shown; prices that do not fit the product are a warning here
    (the sidecar build refuses them, naming the file and the field)."""
    from alpha_core.data.dbn import iter_records, read_info, record_dtype
    from alpha_core.data.validate import PRICE_SCALE, RecordChecks

    rows, failed = [], 0
    for path in args.paths:
        try:
            info = read_info(path)
            checks = RecordChecks(info, record_dtype(info), observe_prices=True)
            count, first, last = 0, None, None
            for chunk in iter_records(info, checks=checks):
                if len(chunk):
                    first = int(chunk["ts_event"][0]) if first is None else first
                    last = int(chunk["ts_event"][-1])
                    count += len(chunk)
        except DataError as exc:
            print(f"alpha inspect: error: {_one_line(exc)}", file=sys.stderr)
            failed += 1
            continue
        warnings = checks.price_warnings()
        for line in warnings:
            print(f"alpha inspect: warning: {line}", file=sys.stderr)
        price = [None if p is None else p / PRICE_SCALE for p in (checks.price_lo, checks.price_hi)]
        rows.append(
            {
                "path": str(path),
                "schema": info.schema,
                "dataset": info.dataset,
                "dbn_version": info.version,
                "stype_in": info.stype_in,
                "symbols": list(info.symbols),
                "records": count,
                "first_ts": _iso(first),
                "last_ts": _iso(last),
                "metadata_start": _iso(info.start),
                "metadata_end": _iso(info.end),
                "price_min": price[0],
                "price_max": price[1],
                "warnings": warnings,
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            prices = "-" if r["price_min"] is None else f"[{r['price_min']:.9g}, {r['price_max']:.9g}]"
            print(
                f"{r['path']}\n  schema={r['schema']} dataset={r['dataset']} dbn=v{r['dbn_version']} "
                f"stype_in={r['stype_in']} symbols={','.join(r['symbols'])}\n"
                f"  records={r['records']} first={r['first_ts']} last={r['last_ts']} prices={prices}"
                + (f" warnings={len(r['warnings'])}" if r["warnings"] else "")
            )
    return 2 if failed else 0  # a file that is not readable DBN is bad input; the others are still shown


def add_inspect_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", type=Path, metavar="FILE")
    p.add_argument("--json", action="store_true")


# --- predecode -------------------------------------------------------------------------------------


def predecode_jobs(data_dir: Path, symbols: list[str] | None) -> list[tuple[Path, str | None]]:
    """(folder, symbol) of each symbol --data-dir and --symbols name (the symbol None: a folder of one product's
    files, not named for it)."""
    from alpha_core.data.predecode import symbol_dir

    named = _named_symbol(data_dir, schema_folder=True)
    if named is not None:
        _agree(data_dir, named, symbols, "--symbols")
        return [(data_dir, named)]
    present = _symbol_folders(data_dir)
    if present:
        return [(symbol_dir(data_dir, s), s) for s in symbols or present]
    if symbols and len(symbols) > 1:
        raise PlanError(f"{data_dir} holds no symbol folders ({', '.join(symbols)} asked): give the data root")
    return [(data_dir, symbols[0] if symbols else None)]


def cmd_predecode(args: argparse.Namespace) -> int:
    from alpha_core.data.checks import sidecar_problems
    from alpha_core.data.predecode import predecode

    problems = []
    for directory, symbol in predecode_jobs(Path(args.data_dir), args.symbols):
        for item in predecode(directory, symbol_cache_dir(args.predecoded_dir, symbol), symbol=symbol):
            m = item.sidecar.meta
            print(f"{item.status:8s} {m.symbol:7s} {m.kind:4s} {m.source.name}: {m.rows} rows -> {item.sidecar.path}")
            problems += sidecar_problems(item.sidecar)
    for p in problems:
        print(f"alpha predecode: integrity: {p}", file=sys.stderr)
    return 1 if problems else 0  # the sidecars were built but failed their checks: the work failed


def add_predecode_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", required=True, type=Path, help="data root ({SYMBOL}/ folders) or one symbol's folder")
    p.add_argument(
        "--output-dir",
        "--predecoded-dir",
        dest="predecoded_dir",
        required=True,
        type=Path,
        metavar="OUTPUT_DIR",
        help="sidecar cache root ({SYMBOL}/ folders are created on a miss) or one symbol's folder",
    )
    p.add_argument("--symbols", type=_symbols, help="comma-separated, e.g. ES,NQ (default: every symbol folder)")


# --- folds -----------------------------------------------------------------------------------------


def cmd_folds(args: argparse.Namespace) -> int:
    from alpha_core.data.dbn import SUPPORTED_SCHEMAS
    from alpha_core.data.folds import check_schemas_agree, plan_folds
    from alpha_core.data.predecode import record_refs

    # grouped into calendar quarters by the records' time
    refs = record_refs(args.data_dir, args.schema, symbol=args.symbol, predecoded_dir=getattr(args, "predecoded_dir", None))
    check_schemas_agree(refs)  # before planning: a quarter one schema lacks is named as such
    plans = {
        s: plan_folds(
            refs[s],
            args.cv_n_folds,
            args.cv_train_window,
            args.allow_untested_folds,
            schema=s,
            purge_sessions=args.purge_sessions,
            embargo_sessions=args.embargo_sessions,
        )
        for s in SUPPORTED_SCHEMAS
        if s in refs
    }
    for plan in plans.values():
        for gap in plan.gaps:
            print(f"alpha folds: warning: gap: {gap}", file=sys.stderr)
    if args.json:
        print(json.dumps({s: p.model_dump() for s, p in plans.items()}, indent=2))
        return 0
    for schema, plan in plans.items():
        print(
            f"{schema}: {plan.n_files} files in {plan.n_units} quarters ({', '.join(plan.units)}), "
            f"{plan.cv_n_folds} fold(s), train window {plan.window}, purge {plan.purge_sessions} and embargo "
            f"{plan.embargo_sessions} session(s)"
        )
        for fold in plan.folds:

            def names(units):
                return ", ".join(u.name for u in units) or "-"

            def cut(dates):
                return f" (not {', '.join(dates)})" if dates else ""

            print(
                f"  fold {fold.fold}: train [{names(fold.train)}]{cut(fold.purged)}  val [{names(fold.val)}]"
                f"{cut(fold.val_embargoed)}  test [{names(fold.test)}]{cut(fold.test_embargoed)}"
            )
    return 0


def add_folds_options(p: argparse.ArgumentParser) -> None:
    from alpha_core.data.folds import plan_folds

    p.add_argument("--data-dir", required=True, type=Path, help=WALK_FORWARD_HELP["data_dir"])
    p.add_argument("--symbol", help=WALK_FORWARD_HELP["symbol"])
    p.add_argument("--cv-n-folds", type=int, default=_default_of(plan_folds, "cv_n_folds"), help="default: %(default)s")
    p.add_argument(
        "--cv-train-window",
        type=int,
        default=_default_of(plan_folds, "cv_train_window"),
        help="calendar quarters per training window; 0: n_quarters - cv_n_folds - 1 (default: %(default)s)",
    )
    p.add_argument(
        "--allow-untested-folds", action="store_true", help="allow folds without a test file (trained, never evaluated; warns)"
    )
    for name in ("purge_sessions", "embargo_sessions"):
        p.add_argument(
            f"--{name.replace('_', '-')}",
            type=int,
            default=_default_of(plan_folds, name),
            help=f"{WALK_FORWARD_HELP[name]} (default: %(default)s)",
        )
    p.add_argument("--schema", choices=list(SCHEMA_FOLDERS), help="only this schema (default: each found)")
    p.add_argument(
        "--predecoded-dir",
        type=Path,
        default=argparse.SUPPRESS,
        help="a sidecar cache (read only): a file whose sidecar there was built from it as it is now is "
        "planned from the sidecar's meta, not decoded",
    )
    p.add_argument("--json", action="store_true")


# --- demo-data -------------------------------------------------------------------------------------


def cmd_demo_data(args: argparse.Namespace) -> int:
    from alpha_core.data.demo import generate_demo_data
    from alpha_core.data.products import PRODUCTS

    paths = generate_demo_data(
        Path(args.out),
        args.scale,
        args.seed,
        args.symbols or list(PRODUCTS),
        args.quarters,
        args.book_sessions,
        args.split,
        args.difficulty,
    )
    print(f"wrote {len(paths)} DBN files ({args.scale}, {args.difficulty}, seed {args.seed}) under {args.out}")
    for p in paths:
        print(f"  {p}")
    return 0


def add_demo_data_options(p: argparse.ArgumentParser) -> None:
    defaults, scales = _source_literals("alpha_core.data.demo", "generate_demo_data", "SCALES")
    p.add_argument(
        "--output-dir", "--out", dest="out", required=True, type=Path, metavar="OUTPUT_DIR", help="data root to write into"
    )
    p.add_argument(
        "--scale",
        choices=scales,
        default=defaults["scale"],
        help="tiny (tests), small (the demo), full (benchmarks) or real (the original workload's shape: "
        "8 quarters of every session, books around each roll) (default: %(default)s)",
    )
    _, difficulties = _source_literals("alpha_core.data.demo", "generate_demo_data", "DIFFICULTIES")
    p.add_argument(
        "--difficulty",
        choices=difficulties,
        default=defaults["difficulty"],
        help="planted (a strong signal: every model wins) or realistic (weak and shifting between quarters, seen by "
        "bars through its price impact: the oracle's own strategy makes an annualised Sharpe of about 2 at 1 tick at "
        "scale real) (default: %(default)s)",
    )
    p.add_argument("--seed", type=_int, default=defaults["seed"], help="default: %(default)s")
    p.add_argument("--symbols", type=_symbols, help="comma-separated (default: ES.FUT,NQ.FUT,ZN.FUT,6E.FUT)")
    p.add_argument("--quarters", type=int, help="quarterly files per symbol (default: the scale's)")
    p.add_argument(
        "--book-sessions",
        type=int,
        help="--scale real: sessions around each roll with an MBP-10 book (default: the scale's, 3; 0: bars only)",
    )
    splits = _source_literals("alpha_core.data.demo", "generate_demo_data", "SPLITS")[1]
    p.add_argument(
        "--split",
        choices=splits,
        default=defaults["split"],
        help="the same records in one file per quarter, per UTC day, week or month (as Databento's batch downloads "
        "split them), or one file for every quarter (default: %(default)s)",
    )


# --- fetch ---------------------------------------------------------------------------------------------


def cmd_fetch(args: argparse.Namespace) -> int:
    from alpha_core.data.fetch import FetchConfig, fetch

    named = _named_symbol(Path(args.data_dir), schema_folder=True)
    if named is not None:
        raise PlanError(f"{args.data_dir} is {named}'s folder: --data-dir is the data root ({{SYMBOL}}/ folders go in it)")
    check_output_path(Path(args.data_dir), True)
    cfg = FetchConfig(**_given(args))
    summary = fetch(cfg, log=lambda line: print(line, flush=True))
    fetched = [u for u in summary.units if u.status == "fetched"]
    if cfg.dry_run:
        print(f"dry run: nothing fetched ({summary.cost_usd:.2f} USD for {len(summary.units)} unit(s) not yet complete)")
    else:
        print(
            f"{summary.symbol}: {len(fetched)} unit(s) fetched, {len(summary.units) - len(fetched)} already complete, "
            f"{summary.cost_usd:.2f} USD -> {Path(summary.data_dir) / summary.symbol}"
        )
    return 0


def add_fetch_options(p: argparse.ArgumentParser) -> None:
    from alpha_core.data.fetch import KEY_ENV, FetchConfig

    add_config_options(
        p,
        FetchConfig,
        {
            "symbol": "parent symbol, e.g. ES or ES.FUT (stype_in=parent: every contract and spread of the product)",
            "start": "first UTC date, YYYY-MM-DD",
            "end": "UTC date after the last one (exclusive), YYYY-MM-DD",
            "schemas": "comma-separated (definition: the contracts behind the rolls)",
            "max_cost": "USD: refuse the whole fetch when the missing units cost more (metadata.get_cost)",
            "dataset": "Databento dataset",
            "gateway": "Historical API gateway",
            "batch_above_bytes": "billable bytes above which a unit goes through a batch job (else timeseries.get_range)",
            "poll_s": "seconds between batch job polls",
            "job_timeout_s": "give up waiting for a batch job after this many seconds (a rerun resumes it)",
            "max_attempts": "attempts per API call on 429 (after Retry-After) and 5xx or dropped connections (backoff)",
            "backoff_s": "first backoff in seconds, doubled per attempt",
            "max_backoff_s": "longest wait between attempts (Retry-After included)",
            "dry_run": "print the cost and size, fetch nothing",
        },
        skip=("data_dir",),
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        default=os.environ.get("ALPHA_DATA_DIR"),
        required=not os.environ.get("ALPHA_DATA_DIR"),
        help=f"data root: files go to {{SYMBOL}}/{{schema}}/ (default: $ALPHA_DATA_DIR); the API key: ${KEY_ENV} only",
    )


# --- train (the flagship perception trainer) ------------------------------------------------------

TRAIN_HELP = {
    "mbp10_data_dir": "data root or one symbol's folder (its MBP-10 files are used)",
    "predecoded_dir": "sidecar cache root or one symbol's folder (created on a miss)",
    "out": "output directory for weights + summary JSON",
    "seq_len": "snapshots per training sequence",
    "lr_aux": "aux AdamW group (default: --lr-cfc)",
    "seed": "(hex works: 0x4242)",
    "lr_warmup_steps": "linear warm-up steps; 0 disables",
    "lr_min_factor": "final LR = lr * this; 1.0 disables decay",
    "early_stop_patience": "epochs without improvement; 0 disables",
    "early_stop_metric": "val_loss | mean_auc | auc_h1000 | none",
    "horizon_weights": "per-horizon BCE weights, e.g. 1.0,1.0,0.5",
    "auto_horizon_weights": "the canonical schedule (uniform)",
    "kernel_step_trace": "write one JSON line per step here",
    "outcome_label_cost": "round-trip cost in price units (default: 2 ticks; 0.5 for ES)",
    "device": "cpu | cuda | cuda:N (default: cuda when available)",
    "resume": "continue from the training state in --output-dir",
    "cuda_graph": "capture the whole training step in one CUDA graph (default: on for cuda)",
    "compile": "torch.compile forward + loss (default: on for cuda; the first step compiles, then cached)",
    "fused_scan": "on cuda, run the CfC recurrence in torch instead of the fused Triton kernel",
    "purge_sessions": "CME sessions dropped from the end of each fold's training, before its validation quarter",
    "embargo_sessions": "CME sessions not scored at the start of each validation and test quarter",
}


def _add_gate_options(p: argparse.ArgumentParser) -> None:
    """The validation gate of the pipeline (alpha_core.gates), printed after every fold: the same rule and defaults
    as the Dagster check, so a CLI user learns what `alpha evaluate` and the report will decide."""
    from alpha_core.gates import GateThresholds

    default = GateThresholds()
    p.add_argument("--min-val-auc", type=float, help=f"gate: mean validation AUC above this (default: {default.min_val_auc})")
    p.add_argument(
        "--min-val-sharpe", type=float, help=f"RL gate: validation Sharpe above this (default: {default.min_val_sharpe})"
    )
    p.add_argument("--strict-gate", action="store_true", help="exit 1 when a fold misses its gate (default: report it, exit 0)")


GATE_FLAGS = ("min_val_auc", "min_val_sharpe", "strict_gate")


def _gate_verdicts(args: argparse.Namespace, trainer: str, summaries: list) -> int:
    """Print each fold's gate verdict; the exit status: 1 with --strict-gate when a fold missed it, else 0."""
    from alpha_core.gates import GateThresholds, check_gate
    from alpha_core.trainers import TRAINERS

    thresholds = GateThresholds(
        **{k: getattr(args, k) for k in ("min_val_auc", "min_val_sharpe") if getattr(args, k, None) is not None}
    )
    missed = 0
    for s in summaries:
        summary = s.model_dump()
        value, loss = TRAINERS[trainer].gated_value(summary)
        gate = check_gate(TRAINERS[trainer], value, thresholds, loss)
        missed += not gate.passed
        fold = summary.get("fold", summary.get("cv_fold"))
        print(
            f"fold {fold} gate: {'passed' if gate.passed else 'FAILED'}: {gate.reason} "
            f"({'promoted by the pipeline, reported' if gate.passed else 'excluded from the report'})"
        )
    return 1 if missed and args.strict_gate else 0


def cmd_train(args: argparse.Namespace) -> int:
    from alpha_core.train.perception import TrainConfig, train

    cfg = TrainConfig(**_given(args, "symbol", *GATE_FLAGS))
    summaries = train(cfg)
    for s in summaries:
        print(
            f"fold {s.cv_fold}: {s.checkpoint_metric} checkpoint from epoch {s.checkpoint_epoch}, val AUC "
            f"{' '.join(f'h{h} {a:.3f}' for h, a in zip(s.horizons, s.val_auc, strict=True))}, "
            f"{s.sequences_per_s:.0f} sequences/s on {s.device} -> {cfg.out / f'fold-{s.cv_fold}'}"
        )
    return _gate_verdicts(args, "perception", summaries)


def add_train_options(p: argparse.ArgumentParser) -> None:
    """Every flag of the original `alpha_train` with its name and default (`--mbp10-data-dir` and `--out` as
    aliases of the `--data-dir` and `--output-dir` every command uses), plus --device/--resume/--precision and the
    GPU switches."""
    from alpha_core.train.configs import TrainConfig

    _add_gate_options(p)
    add_config_options(
        p,
        TrainConfig,
        TRAIN_HELP,
        flags={"out": ["--output-dir", "--out"], "mbp10_data_dir": ["--data-dir", "--mbp10-data-dir"]},
    )
    p.add_argument(
        "--symbol",
        help="the product, e.g. ES or ES.FUT: picks the folder under a data root and the cache "
        "folder under a cache root (default: the folder's name, or the root's only symbol)",
    )


# --- the model zoo ---------------------------------------------------------------------------------


def cmd_models(args: argparse.Namespace) -> int:
    from alpha_core.models.registry import REGISTRY

    rows = [
        {
            "name": s.name,
            "group": s.group,
            "input": s.input,
            "trainer": s.trainer,
            "description": s.description,
            "hyperopt": None
            if s.search_space is None
            else {k: v.model_dump(exclude_none=True) for k, v in s.search_space.items()},
        }
        for s in REGISTRY.values()
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        space = ", ".join(r["hyperopt"]) if r["hyperopt"] else "none"
        print(f"{r['name']:11s} {r['group']:10s} {r['input']:5s} hyperopt: {space}\n            {r['description']}")
    return 0


def add_models_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true")


def _explicit_params(pairs: list[str] | None) -> dict:
    """`--param KEY=VALUE` (VALUE parsed as JSON when it can be: 32, 1e-3, true, [1,2])."""
    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise PlanError(f"--param expects KEY=VALUE, got {pair!r}")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


WALK_FORWARD_HELP = {
    "data_dir": "data root ({SYMBOL}/ folders) or one symbol's folder",
    "output_dir": "fold-<k>/ folders are written here",
    "predecoded_dir": "sidecar cache root ({SYMBOL}/ folders) or one symbol's folder (default: "
    "$ALPHA_STORAGE_ROOT/predecoded, else {output_dir}/.predecoded)",
    "symbol": "the product, e.g. ES or ES.FUT: picks the folder under a data root and the records of files that map "
    "several (default: the folder's name, or the root's only symbol)",
    "early_stop_patience": "epochs without improvement; 0 disables",
    "cv_fold": "train this fold only (default: every fold)",
    "cv_train_window": "calendar quarters per training window; 0: n_quarters - cv_n_folds - 1",
    "cv_n_folds": "walk-forward folds, each with a test file (1: a single train/validation split, never tested)",
    "purge_sessions": "CME sessions dropped from the end of each fold's training, before its validation quarter",
    "embargo_sessions": "CME sessions not scored at the start of each validation and test quarter",
    "allow_hyperopt_leakage": "train with params searched on one of the fold's test files (the report excludes it)",
    "seed": "(hex works: 0x4242)",
    "device": "cpu | cuda | cuda:N (default: cuda when available)",
}


def _add_bar_train_options(p: argparse.ArgumentParser, config_name: str, what: str, helps: dict[str, str]) -> None:
    """The options of a bar trainer's command: its params file and explicit params, the gate, and its settings."""
    from alpha_core.train import configs

    p.add_argument("--params-file", type=Path, help="JSON params or a hyperopt results.json (missing = defaults)")
    p.add_argument("--param", action="append", metavar="KEY=VALUE", help=f"explicit {what} parameter (wins)")
    _add_gate_options(p)
    add_config_options(p, getattr(configs, config_name), {**WALK_FORWARD_HELP, **helps})


def cmd_train_supervised(args: argparse.Namespace) -> int:
    from alpha_core.params import TRAIN_KEYS
    from alpha_core.train.supervised import SupervisedTrainConfig, train_supervised

    values = _given(args, "params_file", "param", *GATE_FLAGS)
    cfg = SupervisedTrainConfig(**values)  # flags are validated before any work
    explicit = {k: values[k] for k in TRAIN_KEYS if k in values}  # flags win over the params file
    explicit.update(_explicit_params(args.param))
    summaries = train_supervised(cfg, args.params_file, explicit)
    for s in summaries:
        print(
            f"fold {s.fold}: {s.checkpoint_metric} checkpoint from epoch {s.checkpoint_epoch}, val AUC "
            f"{' '.join(f'h{h} {a:.3f}' for h, a in zip(s.horizons, s.val_auc, strict=True))} "
            f"-> {cfg.output_dir / f'fold-{s.fold}'}"
        )
    return _gate_verdicts(args, "supervised", summaries)


def add_train_supervised_options(p: argparse.ArgumentParser) -> None:
    _add_bar_train_options(
        p,
        "SupervisedTrainConfig",
        "model/training",
        {
            "model": "a supervised model of `alpha models`",
            "early_stop_metric": "val_loss | mean_auc | auc_h1000 | none",
            "weight_ema": "validate and write a moving average of the weights, moved this close to its last value"
            " each step (0: the trained weights)",
        },
    )


def cmd_train_rl(args: argparse.Namespace) -> int:
    from alpha_core.train.rl import RLTrainConfig, train_rl

    cfg = RLTrainConfig(**_given(args, "params_file", "param", *GATE_FLAGS))
    summaries = train_rl(cfg, args.params_file, _explicit_params(args.param))
    for s in summaries:
        print(
            f"fold {s.fold}: best validation Sharpe {s.val_sharpe:.3f} (epoch {s.best_epoch}), "
            f"turnover {s.val_turnover:.3f} -> {cfg.output_dir / f'fold-{s.fold}'}"
        )
    return _gate_verdicts(args, "rl", summaries)


def add_train_rl_options(p: argparse.ArgumentParser) -> None:
    _add_bar_train_options(
        p,
        "RLTrainConfig",
        "agent",
        {
            "data_dir": f"{WALK_FORWARD_HELP['data_dir']} (its OHLCV-1m files are used)",
            "timesteps_per_epoch": "environment steps per epoch",
            "window": "bars of features in each observation",
            "episode_len": "acting bars per episode",
            "n_envs": "parallel episodes",
            "cost_per_turnover": "ticks per unit of position change",
        },
    )


# --- hyperopt --------------------------------------------------------------------------------------


def cmd_hyperopt(args: argparse.Namespace) -> int:
    from alpha_core import progress
    from alpha_core.hyperopt.pso import HyperoptConfig, hyperopt

    cfg = HyperoptConfig(**_given(args))
    results = hyperopt(cfg)
    best = max(results["trials"], key=lambda t: t["score"])
    print(
        f"best {results['metric']}: {results['best_score']:.4f} with {progress.params_text(results['best_params'])} "
        f"(trial {best['trial']}, {len(results['trials'])} trials) -> {cfg.output} (full precision)"
    )
    return 0


def add_hyperopt_options(p: argparse.ArgumentParser) -> None:
    from alpha_core.hyperopt.configs import HyperoptConfig

    add_config_options(
        p,
        HyperoptConfig,
        {
            "model": "a registry model with a search space (`alpha models`)",
            "data_dir": WALK_FORWARD_HELP["data_dir"],
            "output": "results.json (loadable as --params-file)",
            "trials": "PSO trials (HYPEROPT_TRIALS of `alpha run`)",
            "epochs": "epochs per trial",
            "timesteps_per_epoch": "RL trials: environment steps per epoch",
            "workers": "particles evaluated concurrently per generation",
            "seed": "(hex works: 0x4242)",
            "predecoded_dir": WALK_FORWARD_HELP["predecoded_dir"].replace("{output_dir}", "{output}'s folder"),
            "symbol": WALK_FORWARD_HELP["symbol"],
            "device": WALK_FORWARD_HELP["device"],
            "purge_sessions": WALK_FORWARD_HELP["purge_sessions"],
            "embargo_sessions": WALK_FORWARD_HELP["embargo_sessions"],
        },
    )


# --- evaluate --------------------------------------------------------------------------------------


def cmd_evaluate(args: argparse.Namespace) -> int:
    from alpha_core.eval.evaluate import EvalConfig, evaluate
    from alpha_core.eval.report import summary
    from alpha_core.gates import GateThresholds

    named = _named_symbol(Path(args.data_dir))
    if named is not None:  # one symbol's folder: the root is its parent, and the symbol the only one evaluated
        _agree(Path(args.data_dir), named, getattr(args, "symbols", None), "--symbols")
        args.data_dir, args.symbols = Path(args.data_dir).parent, [named]
    if getattr(args, "predecoded_dir", None) is not None and _named_symbol(Path(args.predecoded_dir)):
        args.predecoded_dir = Path(args.predecoded_dir).parent  # evaluation reads the cache by symbol under its root
    thresholds = {name: getattr(args, name) for name in GateThresholds.model_fields if hasattr(args, name)}
    cfg = EvalConfig(**_given(args, *GateThresholds.model_fields), gate=GateThresholds(**thresholds))
    if not cfg.models_dir.is_dir():
        raise DataError(cfg.models_dir, "no such models directory")
    if not any(any(cfg.models_dir.glob(f"*/{symbol}/fold-*")) for symbol in cfg.symbols or ["*"]):
        which = f" for {', '.join(cfg.symbols)}" if cfg.symbols else ""
        raise DataError(cfg.models_dir, f"no checkpoints{which} (expected <model>/<symbol>/fold-<k>/ folders)")
    report = evaluate(cfg)
    print(summary(report, cfg.output))
    if not any(sym.models for sym in report.symbols.values()):
        print(
            f"alpha evaluate: error: nothing could be evaluated ({len(report.excluded)} checkpoint(s) excluded, "
            f"reasons above; the report lists them in {cfg.output})",
            file=sys.stderr,
        )
        return 1
    return 0


def add_evaluate_options(p: argparse.ArgumentParser) -> None:
    from alpha_core.eval.configs import EvalConfig
    from alpha_core.gates import GateThresholds

    add_config_options(
        p,
        EvalConfig,
        {
            "models_dir": "models/<model>/<symbol>/fold-<k>/ checkpoints",
            "data_dir": "data root ({SYMBOL}/ folders), or one symbol's folder (then only that symbol)",
            "output": "ensemble_report.json (.md and PNGs beside it)",
            "symbols": "comma-separated, e.g. ES,NQ (default: every symbol with checkpoints)",
            "horizon": "--policy fixed: horizon index the positions follow (0: the shortest)",
            "band": "--policy fixed: flat while |P(up) - 0.5| <= band",
            "policy": "fitted: each checkpoint's policy (horizon, threshold, holding, sizing) chosen on its validation "
            "file; fixed: the old rule at --horizon and --band, one bar",
            "cost_ticks": "cost per unit of position change in ticks",
            "embargo_sessions": f"{WALK_FORWARD_HELP['embargo_sessions']}: the fold plan's, as the checkpoints were "
            "trained with",
            "hyperopt_results": "MODEL=PATH,...: the hyperopt results.json behind each model (the DSR's trials)",
            "expected": "MODEL:FOLD,...: requested checkpoints; any without results is listed as excluded",
            "predecoded_dir": "sidecar cache root ({SYMBOL}/ folders; default: .predecoded beside --output)",
            "device": "cpu | cuda | cuda:N (default: cuda when available)",
        },
        skip=("upstream_excluded", "gate"),
    )
    # the validation gate, as at promotion: a checkpoint at or below it is listed as excluded, "gate failed"
    add_config_options(
        p,
        GateThresholds,
        {
            "min_val_auc": "a supervised or book checkpoint's mean validation AUC must be above this",
            "min_val_sharpe": "an RL checkpoint's validation Sharpe must be above this",
        },
    )


# --- run (Dagster) ---------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    """The CI trigger as one Dagster asset backfill; the one command that needs Dagster (alpha_assets.run)."""
    # Dagster's notes on its own beta and preview APIs, raised while the definitions load, are not the user's business
    warnings.filterwarnings("ignore", message=r".* is currently in (beta|preview)")
    from alpha_assets import run

    plan = run.plan(
        args.symbols or [],
        args.models,
        args.phase,
        args.epochs,
        args.hyperopt_trials,
        args.run_id or run.default_run_id(),
        args.max_parallel,
        run.parse_json_option("--train-config", args.train_config),
        run.parse_json_option("--hyperopt-config", args.hyperopt_config),
        [r for r in (args.reuse_from or "").split(",") if r],
        run.parse_json_option("--fold-config", args.fold_config),
    )
    print(
        f"RUN_ID {plan.run_id}: one backfill of {plan.size} asset partitions ({plan.phase}) for "
        f"{','.join(plan.symbols)}, models {','.join(plan.models)}, at most {plan.max_parallel} GPU steps at once",
        flush=True,
    )
    for line in run.spend(plan, remote=bool(args.remote)):
        print(line, flush=True)
    if args.dry_run:
        print(run.describe(plan))
        return 0
    ok = (
        run.launch_remote(plan, args.remote, allow_gate_failures=args.allow_gate_failures)
        if args.remote
        else run.launch_local(plan, allow_gate_failures=args.allow_gate_failures)
    )
    if not args.remote:  # the reports are on this host's storage: end with what they say
        run.print_summaries(plan)
    return 0 if ok else 1


def add_run_options(p: argparse.ArgumentParser) -> None:
    env = os.environ.get
    p.add_argument(
        "--symbols", type=_symbols, default=env("SYMBOLS", "ES.FUT"), help="comma-separated (env SYMBOLS; default: %(default)s)"
    )
    p.add_argument(
        "--models", default=env("MODELS", "all"), help="all | rl | supervised | a,b (env MODELS; default: %(default)s)"
    )
    p.add_argument(
        "--phase", default=env("PHASE", "full"), help="hyperopt | train | eval | full (env PHASE; default: %(default)s)"
    )
    # argparse converts string defaults with `type`, so a bad environment value is a clean usage error
    p.add_argument(
        "--max-parallel",
        type=int,
        default=env("MAX_PARALLEL", "10"),
        help="GPU steps at once across the instance: the `gpu` pool limit (env MAX_PARALLEL)",
    )
    p.add_argument(
        "--epochs",
        type=int,
        default=env("EPOCHS"),
        help="per walk-forward fold (env EPOCHS; default: each trainer's, 50 for the ensemble)",
    )
    p.add_argument(
        "--hyperopt-trials",
        type=int,
        default=env("HYPEROPT_TRIALS"),
        help="PSO trials per model (env HYPEROPT_TRIALS; default: alpha hyperopt's, 20)",
    )
    p.add_argument("--run-id", default=env("RUN_ID") or None, help="default: YYYYMMDD-HHMMSS (env RUN_ID)")
    p.add_argument(
        "--reuse-from",
        metavar="RUN[,RUN]",
        help="other runs whose checkpoints and hyperopt params this run may use, by name (each report row then names "
        "its run); without it a run uses only what it materialized itself",
    )
    p.add_argument("--remote", help="a running Dagster webserver, e.g. http://dagster-webserver:80")
    from alpha_core.step_settings import describe

    p.add_argument("--train-config", help=f"JSON merged into every checkpoint's config; keys: {describe('checkpoints')}")
    p.add_argument("--hyperopt-config", help=f"JSON merged into every hyperopt config; keys: {describe('hyperopt')}")
    p.add_argument(
        "--fold-config",
        help="JSON for the run's fold plans, which every step trains on; keys: cv_train_window (ge 0; 0: as many "
        "quarters as leave a validation and a test quarter to every fold), purge_sessions, embargo_sessions (0-66; "
        "default 0 and 0, as alpha folds)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the backfill only")
    p.add_argument(
        "--allow-gate-failures",
        action="store_true",
        help="a checkpoint below its gate is reported (excluded, gate failed) instead of failing the command",
    )


# --- clean -----------------------------------------------------------------------------------------


def cmd_clean(args: argparse.Namespace) -> int:
    from alpha_core.cleanup import clean

    roots = [Path(p) for p in (args.paths or [os.environ.get("ALPHA_STORAGE_ROOT", "storage")])]
    for root in args.paths or []:  # a folder named on the command line must exist (the default may not yet)
        if not Path(root).is_dir():
            raise DataError(root, "no such folder")
    removed = clean(roots, args.older_than_days * 86_400, dry_run=args.dry_run)
    for r in removed:
        print(f"{'would remove' if args.dry_run else 'removed'} {r.path}: {r.reason}")
    print(f"{len(removed)} item(s) {'to remove' if args.dry_run else 'removed'} under {', '.join(map(str, roots))}")
    return 0


def add_clean_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", metavar="PATH", help="storage roots or output folders (default: $ALPHA_STORAGE_ROOT)")
    p.add_argument(
        "--older-than-days",
        type=float,
        default=7.0,
        help="unfinished attempts untouched this long are removed (default: %(default)s)",
    )
    p.add_argument("--dry-run", action="store_true", help="list what would be removed")


def cmd_compare(args: argparse.Namespace) -> int:
    from alpha_core.eval.compare import compare

    print(compare(args.runs, Path(args.storage_root) if args.storage_root else None), end="")
    return 0


def add_compare_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN", help="RUN_IDs under the storage root, or report files/run folders")
    p.add_argument("--storage-root", help="where the runs are (default: $ALPHA_STORAGE_ROOT, else storage)")


def cmd_ui(args: argparse.Namespace) -> int:
    """`dg dev` (webserver, daemon, code server) for this project's instance, stopped whole on Ctrl-C or SIGTERM; its
    daemon looks at backfills every 3 s, as `alpha run`'s does (Dagster's own: every 30 s)."""
    import subprocess

    from alpha_assets.dagster_private import dev_command

    root = Path(__file__).resolve().parents[1]  # the project: its workspace.yaml names the code location
    command = dev_command(root / "workspace.yaml", args.port, args.host)
    proc = subprocess.Popen(command, cwd=root, start_new_session=True)
    print(f"alpha ui: Dagster's UI at http://{args.host}:{args.port} (pid {proc.pid}); Ctrl-C stops it", flush=True)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        stop_group(proc)
        return 0


def add_ui_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, default=3000, help="the webserver's port (default: %(default)s)")
    p.add_argument("--host", default="127.0.0.1", help="the address it listens on (default: %(default)s)")


# --- entry point -----------------------------------------------------------------------------------

# name: (help, options, handler); a command's options are added only when it is the one parsed, so `alpha --help`
# and `alpha inspect` import nothing heavy (the configs are light modules; torch loads when a command trains)
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "inspect": ("show schema, dataset, version, symbols, counts and time range of DBN files", add_inspect_options, cmd_inspect),
    "predecode": ("build or reuse the predecoded sidecars of every DBN file", add_predecode_options, cmd_predecode),
    "folds": ("print the walk-forward fold plan of one symbol's DBN files", add_folds_options, cmd_folds),
    "demo-data": ("write synthetic DBN files with a planted, learnable signal", add_demo_data_options, cmd_demo_data),
    "fetch": ("download a symbol's MBP-10, OHLCV-1m and definitions from Databento", add_fetch_options, cmd_fetch),
    "train": ("train the Mamba2 -> CfC -> heads perception model on MBP-10 sidecars", add_train_options, cmd_train),
    "train-supervised": (
        "walk-forward training of a supervised registry model",
        add_train_supervised_options,
        cmd_train_supervised,
    ),
    "train-rl": ("walk-forward training of the DQN / PPO members", add_train_rl_options, cmd_train_rl),
    "hyperopt": ("particle swarm search over a registry model's hyperparameters", add_hyperopt_options, cmd_hyperopt),
    "evaluate": ("out-of-sample backtests of every checkpoint and the ensemble report", add_evaluate_options, cmd_evaluate),
    "run": ("the CI trigger: SYMBOLS/MODELS/PHASE/... as one Dagster backfill (local or --remote)", add_run_options, cmd_run),
    "compare": ("two or more runs' report rows side by side, and every setting that differs", add_compare_options, cmd_compare),
    "ui": ("Dagster's UI and daemon on $DAGSTER_HOME (dg dev), stopped whole on Ctrl-C or SIGTERM", add_ui_options, cmd_ui),
    "models": ("list the model registry (name, group, input, hyperopt space)", add_models_options, cmd_models),
    "clean": (
        "remove what crashed writers left (stale temporaries, dead locks, abandoned attempts)",
        add_clean_options,
        cmd_clean,
    ),
}


def _add_global_options(p: argparse.ArgumentParser) -> None:
    """--debug and --quiet, accepted before or after the command."""
    p.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="on error, show the full traceback (or set ALPHA_DEBUG=1)",
    )
    p.add_argument("--quiet", action="store_true", default=argparse.SUPPRESS, help="no progress bars on stderr")


def build_parser(command: str | None = None) -> Parser:
    """The `alpha` parser with the options of `command` only (of every command when None)."""
    parser = Parser(prog="alpha", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"alpha {alpha_core.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, add_options, handler) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if command is None or command == name:
            add_options(p)
        p.set_defaults(func=handler)
    for p in (parser, *sub.choices.values()):
        _add_global_options(p)
    parser.chosen = sub.choices.get(command)
    return parser


def _command(argv: Sequence[str]) -> str:
    """The command word (the first argument that is not an option; the global options take no value)."""
    return next((a for a in argv if not a.startswith("-")), "")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _command(argv)
    parser = build_parser(command)  # "" (no command): the list of commands only
    if command and command not in COMMANDS:
        close = difflib.get_close_matches(command, COMMANDS, n=1)
        print(
            f"{short_usage(parser)}\nalpha: error: unknown command {command!r}"
            f"{f' (did you mean {close[0]}?)' if close else ''}; commands: {', '.join(COMMANDS)}",
            file=sys.stderr,
        )
        return 2
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:  # --help, --version (0) or a usage error (2), already printed
        return done.code if isinstance(done.code, int) else 2
    debug = getattr(args, "debug", False) or os.environ.get("ALPHA_DEBUG", "") not in ("", "0")
    from alpha_core import progress

    progress.set_quiet(getattr(args, "quiet", False))
    roots = storage_roots(args)
    try:
        with warnings.catch_warnings(), stop_on_signals():  # SIGTERM stops any command as Ctrl-C does
            if not debug:  # a library warning is one line too
                warnings.showwarning = lambda message, *_, **__: print(
                    f"alpha {args.command}: warning: {_one_line(message)}", file=sys.stderr
                )
            check_symbols(args)
            if args.command in ONE_SYMBOL:
                resolve_one_symbol(args)
            for path, is_dir in _outputs(args):
                check_output_path(path, is_dir)
            return args.func(args)
    except KeyboardInterrupt:
        if debug:
            raise
        return 130
    except Exception as exc:
        if debug:
            raise
        code, message = describe_error(exc, args)
        print(f"alpha {args.command}: error: {message}", file=sys.stderr)
        return code
    finally:
        mark_storage_roots(roots)


if __name__ == "__main__":
    sys.exit(main())
