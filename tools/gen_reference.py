"""Generate the reference pages (docs/reference/*.md) from the code itself.

    python tools/gen_reference.py            # write the pages
    python tools/gen_reference.py --check    # compare; exit 1 naming every stale page
    python tools/gen_reference.py --out DIR  # write them under DIR instead (the test's way)

The pages: the command line (the argparse parsers), the study file (the pydantic schema), the
method and precision names (the registry, the method entries, the precision table), the exit codes,
the ``LSBENCH_*`` environment variables (every one the package's source names, described in
``lossscale_bench.env_vars``; a variable without a description stops the generator) and the logged
metrics and tags (``lossscale_bench.logged_names``; an ``lsbench.*`` tag named in the source without
an entry stops it too). The output is deterministic: no dates, no machine paths, tables in a fixed
order, and the defaults that an environment variable could change are those with it unset.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from reference_md import (
    anchor,
    attribute_docs,
    cell,
    code,
    comment_docs,
    models_in,
    page,
    paragraph,
    table,
    type_text,
    value,
)

# --- every package name the generator reads; repoint here when modules move --------------------------
import lossscale_bench
from lossscale_bench.cli import build_parser
from lossscale_bench.core import env_vars, exit_codes, logged_names
from lossscale_bench.core.env_vars import ENV_VARS
from lossscale_bench.core.logged_names import EXPERIMENT_TAGS, METRICS, TAGS, entry_for
from lossscale_bench.core.registry import AMAX_RECIPES, BACKEND_NAMES, DYNAMIC_STYLES, EVAL_METRICS
from lossscale_bench.data.download import register as register_data_parser
from lossscale_bench.study import Study, key_docs, plugins
from lossscale_bench.study.key_docs import KEY_DOCS
from lossscale_bench.study.methods import ENTRIES, MethodEntry
from lossscale_bench.study.precisions import PRECISION_OPTIONS, PRECISION_SPECS

#: the package's own plug-ins only: the pages describe the package, not what this machine has installed
MODEL_NAMES = plugins.names("model", entry_points=False)
SCALING_METHODS = plugins.names("method", entry_points=False)
PRECISION_NAMES = plugins.names("precision", entry_points=False)
DATASET_NAMES = plugins.names("dataset", entry_points=False)

# -------------------------------------------------------------------------------------------------------

PACKAGE_DIR = Path(lossscale_bench.__file__).resolve().parent
OUT_DIR = ROOT / "docs" / "reference"
#: the scaling entry keys every method has (its options are on the names page)
ENTRY_COMMON = [k for k in MethodEntry.model_fields]


# ========================================================================================= the CLI page
def _subparsers(parser: argparse.ArgumentParser):
    return [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]


def _option_rows(parser: argparse.ArgumentParser) -> list[list]:
    rows = []
    for a in parser._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)) or a.help == argparse.SUPPRESS:
            continue
        name = ", ".join(code(o) for o in a.option_strings) if a.option_strings else code(a.metavar or a.dest)
        if a.option_strings and a.nargs != 0:
            name += f" {code(a.metavar or a.dest.upper())}"
        if not a.option_strings:
            need = {"?": "optional", "*": "zero or more", "+": "one or more"}.get(a.nargs, "required")
        else:
            need = "required" if a.required else ("flag" if a.nargs == 0 else "optional")
            if a.nargs in ("+", "*"):
                need += ", one or more"
        default = "—" if a.nargs == 0 or a.default in (None, argparse.SUPPRESS) or a.required else value(a.default)
        choices = ", ".join(code(c) for c in a.choices) if a.choices else "—"
        helptext = (a.help or "") % {"default": a.default, "prog": parser.prog} if a.help and "%(" in a.help else a.help
        rows.append([name, need, default, choices, helptext])
    return rows


def _command_sections(parser: argparse.ArgumentParser, path: str, level: int) -> list[str]:
    out = []
    for sub in _subparsers(parser):
        helps = {ca.dest: ca.help for ca in sub._choices_actions}
        for name, child in sub.choices.items():
            full = f"{path} {name}"
            if full == "lsbench data":  # main() hands it to data/download.py's own parser
                holder = argparse.ArgumentParser(prog="lsbench").add_subparsers()
                child = register_data_parser(holder)
            text = [f"{'#' * level} `{full}`", cell(helps.get(name))]
            if child.description:
                text.append(cell(child.description))
            rows = _option_rows(child)
            if rows:
                text.append(table(["Argument", "Given", "Default", "Choices", "What it does"], rows))
            out.append("\n\n".join(text))
            out += _command_sections(child, full, level + 1)
    return out


def cli_page() -> str:
    parser = build_parser()
    commands = [
        f"- [`lsbench {n}`](#lsbench-{n}): {cell(ca.help)}"
        for sub in _subparsers(parser)
        for ca in sub._choices_actions
        for n in [ca.dest]
    ]
    intro = (
        f"{cell(parser.description)}. Every command and its arguments as the parsers define them "
        "(`lsbench COMMAND --help` prints the same). Defaults are those with no `LSBENCH_*` variable set "
        "([environment](environment.md)); exit codes: [exit codes](exit-codes.md)."
    )
    return page("Command line", intro, "\n".join(commands), *_command_sections(parser, "lsbench", 2))


# ================================================================================= the study file page
#: the KEY_DOCS keys the pages looked up (one the schema does not have is a stale entry)
USED_KEY_DOCS: set[str] = set()


def field_rows(cls, prefix: str, keys: list[str] | None = None, skip=(), doc_prefix: str | None = None) -> list[list]:
    """One row per field of ``cls``: key, type, default, allowed values, description (the field's ``#:``
    comment, else ``KEY_DOCS[doc_prefix + name]``, else a precision option's own text)."""
    schema = cls.model_json_schema()
    defs, props = schema.get("$defs", {}), schema["properties"]
    docs = attribute_docs(cls)
    rows = []
    for name in keys if keys is not None else list(cls.model_fields):
        if name in skip:
            continue
        info = cls.model_fields[name]
        kind, allowed = type_text(props[name], defs)
        if info.is_required():
            default = "required"
        else:
            d = info.get_default(call_default_factory=True)
            default = "its defaults" if models_in(type(d)) else value(d)
        sub = models_in(info.annotation)
        if sub and kind.startswith("mapping"):
            allowed = f"see [{prefix}{name}](#{anchor(prefix + name)})"
        key = (prefix if doc_prefix is None else doc_prefix) + name
        USED_KEY_DOCS.add(key)
        text = (
            docs.get(name)
            or KEY_DOCS.get(key)
            or (PRECISION_OPTIONS[name].doc if name in PRECISION_OPTIONS else "")
            or (model_option_doc(name) if prefix == "model_options." else "")
        )
        rows.append([code(prefix + name), kind, default, allowed, text])
    return rows


def model_option_doc(name: str) -> str:
    """A ``model_options`` key's doc: the first model whose registry entry has it (and which models do)."""
    having = [m for m in MODEL_NAMES if plugins.entry("model", m).option(name) is not None]
    if not having:
        return ""
    doc = plugins.entry("model", having[0]).option(name).doc
    return doc if len(having) == len(MODEL_NAMES) else f"{', '.join(having)} only: {doc}"


def study_page() -> str:
    top = field_rows(Study, "", skip=("source", "seed_plan"))
    sections = [
        "## Top-level keys\n\nA list key may be written as one value "
        "(`seeds: 0` is `seeds: [0]`); a section left empty (`eval:`) takes its defaults.\n\n"
        + table(["Key", "Type", "Default", "Allowed", "What it is"], top)
    ]
    for name, info in Study.model_fields.items():
        models = models_in(info.annotation)
        if name in ("dataset", "scaling", "source") or not models:
            continue
        cls = models[0]
        if name == "seed_plan":  # not a key of its own: the plan form of `seeds`
            sections.append(
                "## seeds (plan form)\n\n`seeds: {start: 3, step: 3, max: 18}` instead of a list: seeds "
                "are added, in rounds, to the rows whose comparisons are not decided yet (reports and "
                "verdicts, in the guide).\n\n"
                + table(["Key", "Type", "Default", "Allowed", "What it is"], field_rows(cls, "seeds."))
            )
            continue
        intro = cell(paragraph(cls.__doc__)) if cls.__doc__ and cls.__module__.startswith("lossscale_bench") else ""
        sections.append(
            f"## {name}\n\n"
            + (intro + "\n\n" if intro not in ("", "—") else "")
            + table(["Key", "Type", "Default", "Allowed", "What it is"], field_rows(cls, f"{name}."))
        )
    variants = models_in(Study.model_fields["dataset"].annotation)
    ds = ["## dataset\n\n`dataset: NAME` is short for `dataset: {name: NAME}`. The keys depend on `name`:"]
    for cls in variants:
        dname = cls.model_json_schema()["properties"]["name"].get("const")
        ds.append(
            f"### dataset: {dname}\n\n"
            + table(
                ["Key", "Type", "Default", "Allowed", "What it is"],
                field_rows(cls, "dataset.", keys=["name", *(k for k in cls.model_fields if k != "name")]),
            )
        )
    sections.append("\n\n".join(ds))
    common = field_rows(ENTRIES[SCALING_METHODS[0]], "scaling[].", keys=["method", *ENTRY_COMMON])
    common[0][2:4] = ["required", ", ".join(code(m) for m in SCALING_METHODS)]
    common[0][4] = "The scaling method; its own options are on the [names](names.md#scaling-methods) page."
    overrides = field_rows(models_in(MethodEntry.model_fields["resources"].annotation)[0], "scaling[].resources.")
    sections.append(
        "## scaling\n\nA list of entries, one report row each: a mapping, or just the method's name "
        "(`- adaptive`). Besides its method's options, every entry may have these keys (`precision`, "
        "`model`, `batch_size` and `resources` override the study's for the entry's trials; the "
        "precision options apply only to the precisions that name them, "
        "[names](names.md#precision-options)):\n\n"
        + table(["Key", "Type", "Default", "Allowed", "What it is"], common)
        + "\n\n### scaling[].resources\n\n"
        + table(["Key", "Type", "Default", "Allowed", "What it is"], overrides)
    )
    intro = (
        "Every key a study file (YAML) may have, from the schema `lsbench validate` checks. A key not "
        'listed is refused, naming the file, the key and what is allowed. "not given" is a default '
        "that leaves the choice to the code (each key's text says what it then does)."
    )
    return page("Study file", intro, *sections)


# ====================================================================================== the names page
def _entry_defaults(entry) -> dict:
    """The method module's ``DEFAULTS`` table (per style for dynamic), where an option's field is None."""
    return getattr(sys.modules[entry.__module__], "DEFAULTS", {}) or {}


def method_section(method: str) -> str:
    entry = ENTRIES[method]
    doc = paragraph(sys.modules[entry.__module__].__doc__)
    rows = field_rows(entry, "", keys=entry.option_names(), doc_prefix=f"{method}.")
    defaults = _entry_defaults(entry)
    for row in rows:
        key = row[0].strip("`")
        if row[2] == "not given" and key in defaults:
            row[2] = value(defaults[key])
        elif row[2] == "not given" and defaults and all(isinstance(v, dict) for v in defaults.values()):
            per = [f"{style}: {value(d[key])}" for style, d in defaults.items() if key in d]
            row[2] = "; ".join(per) if per else row[2]
    kind = "per-layer (scales each layer's gradient)" if entry.per_layer else "one scale for the whole loss"
    text = [f"### `{method}`", cell(doc), f"Scaler: `{entry.scaler.replace(':', '.')}`, {kind}."]
    text.append(
        table(["Option", "Type", "Default", "Allowed", "What it is"], rows) if rows else "No options of its own."
    )
    return "\n\n".join(text)


def names_page() -> str:
    sections = [
        (
            "## Scaling methods\n\nA study's `scaling` entries name one of these in `method:` "
            "(each registered where it is described, `lossscale_bench/study/methods/`); each entry also takes "
            "the [common keys](study-file.md#scaling)."
        )
    ]
    sections += [method_section(m) for m in SCALING_METHODS]
    rows = []
    for name in PRECISION_NAMES:
        spec = PRECISION_SPECS[name]
        scaling = spec.grad_scaling or "—"
        rows.append(
            [
                code(name),
                spec.autocast or "—",
                spec.forward_format or "fp32",
                spec.grad_format or "fp32",
                scaling,
                "yes" if spec.emulated else "no",
                "yes" if spec.needs_scaler else "no",
                spec.te_format or "—",
                ", ".join(code(o) for o in spec.options) or "—",
            ]
        )
    sections.append(
        "## Precisions\n\n`precision:` (study-wide, or a scaling entry's own) names one of these "
        "(the table in `lossscale_bench/study/precisions.py`). Emulated: computed in fp32 on the CPU, values rounded to the formats "
        "(the report marks such rows). Loss scale: whether the gradients are in a narrow format, so "
        "a loss scale has something to rescue.\n\n"
        + table(
            [
                "Precision",
                "Autocast",
                "Forward values",
                "Gradients",
                "Gradient blocks",
                "Emulated",
                "Loss scale",
                "Transformer Engine",
                "Options",
            ],
            rows,
        )
    )
    sections.append(
        "\n".join(f"- `{n}`: {cell(PRECISION_SPECS[n].doc or PRECISION_SPECS[n].note)}" for n in PRECISION_NAMES)
    )
    orows = [
        [
            code(o.name),
            ", ".join(value(c) for c in o.choices),
            value(o.default),
            ", ".join(code(n) for n, s in PRECISION_SPECS.items() if o.name in s.options),
            o.doc,
        ]
        for o in PRECISION_OPTIONS.values()
    ]
    sections.append(
        "## Precision options\n\nKeys of a scaling entry that change how its precision rounds; only "
        "the precisions listed take them.\n\n"
        + table(["Option", "Values", "Default", "Precisions", "What it does"], orows)
    )
    sections.append(models_section())
    others = [
        ("Datasets (`dataset.name`)", DATASET_NAMES),
        ("Backends (`resources.backend`)", BACKEND_NAMES),
        ("Evaluation protocols (`eval.metric`)", EVAL_METRICS),
        ("Dynamic scaling styles (`style`)", DYNAMIC_STYLES),
        ("amax recipes (`recipe`)", AMAX_RECIPES),
    ]
    sections.append(
        "## Other names\n\n" + "\n".join(f"- {what}: " + ", ".join(code(n) for n in names) for what, names in others)
    )
    return page(
        "Methods, precisions and other names",
        "Every name a study file may use, from the plug-in registry (`lossscale_bench/core/plugins.py`: each "
        "model, method, precision and data set registered where it is described) and the fixed names of "
        "`lossscale_bench/core/registry.py`. `lsbench plugins` lists them with those installed "
        "distributions add ([your own detector](../guide/your-model.md)).",
        *sections,
    )


def models_section() -> str:
    """The models: each one's display name, builder, options (with their docs) and version."""
    text = [
        "## Models\n\n`model:` names one of these, or a builder of your own by import path "
        "(`package.module:callable`, [your own detector](../guide/your-model.md)); `model_options` "
        "are the builder's keyword arguments."
    ]
    for name in MODEL_NAMES:
        p = plugins.entry("model", name)
        rows = [
            [
                code(o.name),
                o.type,
                value(o.default),
                ", ".join(value(a) for a in o.allowed) if o.allowed else "—",
                o.doc,
            ]
            for o in p.options
        ]
        version = f", version {p.version}" if p.version is not None else ""
        text.append(
            f"### `{name}`\n\n{cell(p.doc)} Reported as {p.display_name}; built by "
            f"`{p.target.replace(':', '.')}`{version}.\n\n"
            + table(["Option", "Type", "Default", "Allowed", "What it is"], rows)
        )
    return "\n\n".join(text)


# ================================================================================== exit codes page
#: exit status 1 is Python's own (exit_codes.py's module doc): no constant names it
EXIT_INTERNAL = [
    1,
    "—",
    ("an internal error (a bug): Python's own status for an uncaught exception; the traceback is printed"),
]


def exit_codes_page() -> str:
    source = inspect.getsource(exit_codes).splitlines()
    docs, last = {}, None
    comments = comment_docs(source)
    for line in source:  # a constant without its own comment shares the one above it (SIGINT / SIGTERM)
        m = re.match(r"(EXIT_\w+)\s*=", line)
        if m:
            docs[m.group(1)] = comments.get(m.group(1)) or (docs.get(last) if last else "")
            last = m.group(1)
        elif line.strip() and not line.startswith("#"):
            last = None
    rows = [[getattr(exit_codes, n), code(n), docs[n]] for n in docs]
    rows = sorted(rows + [EXIT_INTERNAL], key=lambda r: r[0])
    return page(
        "Exit codes",
        "What `lsbench` returns, from `lossscale_bench/core/exit_codes.py`; scripts and schedulers can branch on it.",
        table(["Code", "Name", "Meaning"], rows),
    )


# ================================================================================ environment page
ENV_NAME = re.compile(r"\bLSBENCH_[A-Z0-9_]*[A-Z0-9]\b")


#: the modules that describe names rather than use them (their mentions are not reads)
DESCRIBING = {Path(m.__file__).resolve() for m in (env_vars, logged_names, key_docs)}


def env_vars_read() -> dict[str, list[str]]:
    """``LSBENCH_*`` names in the package's source (code, strings, comments), with the files naming each
    (the tables that describe them left out)."""
    found: dict[str, set] = {}
    for path in sorted(PACKAGE_DIR.rglob("*")):
        if path.suffix in (".py", ".c", ".h", ".yaml") and path.is_file() and path.resolve() not in DESCRIBING:
            for name in ENV_NAME.findall(path.read_text(encoding="utf-8", errors="replace")):
                found.setdefault(name, set()).add(path.relative_to(PACKAGE_DIR.parent).as_posix())
    return {k: sorted(v) for k, v in sorted(found.items())}


def environment_page() -> str:
    read = env_vars_read()
    missing = sorted(set(read) - set(ENV_VARS))
    if missing:
        raise SystemExit(
            "gen_reference: the package reads " + ", ".join(missing) + " with no description in "
            "lossscale_bench/core/env_vars.py ENV_VARS: add one"
        )
    rows = [[code(n), ENV_VARS[n], ", ".join(code(f) for f in read.get(n, []))] for n in sorted(ENV_VARS)]
    return page(
        "Environment variables",
        "Every `LSBENCH_*` variable the package reads (`lossscale_bench/core/"
        "env_vars.py`). Variables of the libraries (`MLFLOW_TRACKING_URI`, `RAY_ADDRESS`, "
        "`CUDA_VISIBLE_DEVICES`, "
        "...) keep their own meaning.",
        table(["Variable", "What it does", "Named in"], rows),
    )


# ================================================================================ metrics page
def tags_named() -> list[str]:
    """``lsbench.*`` tag names in the package's source: string constants, and f-strings with ``<>``
    where a value is put in."""
    found = set()
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else "<>" for v in node.values)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
            else:
                continue
            if re.fullmatch(r"lsbench\.[\w.<>]*\w[\w.<>]*", text) and not text.endswith("."):
                found.add(text)
    return sorted(found)


def metrics_page() -> str:
    missing = [t for t in tags_named() if entry_for(t.replace("<>", "x"), {**TAGS, **EXPERIMENT_TAGS}) is None]
    if missing:
        raise SystemExit(
            "gen_reference: the package names tag(s) " + ", ".join(missing) + " with no entry in "
            "lossscale_bench/core/logged_names.py TAGS: add one"
        )
    sections = [
        "## Metrics\n\n" + table(["Metric", "What it is"], [[code(k), v] for k, v in sorted(METRICS.items())]),
        "## Run tags\n\n" + table(["Tag", "What it holds"], [[code(k), v] for k, v in sorted(TAGS.items())]),
        "## Experiment tags\n\n"
        + table(["Tag", "What it holds"], [[code(k), v] for k, v in sorted(EXPERIMENT_TAGS.items())]),
    ]
    return page(
        "Logged metrics and tags",
        "What a study writes to its MLflow store (`lossscale_bench/core/"
        "logged_names.py`). mAP is stored as a fraction (0.512) and shown in percent by the reports. A "
        "part in angle brackets stands for one of the values it lists (`<mean,max>`) or for any text.",
        *sections,
    )


# ======================================================================================== main
PAGES = {
    "cli.md": cli_page,
    "study-file.md": study_page,
    "names.md": names_page,
    "exit-codes.md": exit_codes_page,
    "environment.md": environment_page,
    "metrics.md": metrics_page,
}


def generate() -> dict[str, str]:
    """page file name -> its text."""
    pages = {name: make() for name, make in PAGES.items()}
    stale = sorted(set(KEY_DOCS) - USED_KEY_DOCS)
    if stale:
        raise SystemExit(
            "gen_reference: lossscale_bench/study/key_docs.py describes keys the schema does not "
            "have: " + ", ".join(stale)
        )
    return pages


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the pages on disk; exit 1 naming stale ones")
    ap.add_argument("--out", type=Path, default=OUT_DIR, help="folder of the pages (default docs/reference)")
    args = ap.parse_args(argv)
    for var in [v for v in os.environ if v.startswith("LSBENCH_")]:  # some are defaults (--runs-dir): the
        del os.environ[var]  # pages show the defaults with every LSBENCH_* variable unset
    pages = generate()
    if args.check:
        stale = [
            n
            for n, text in pages.items()
            if not (args.out / n).is_file() or (args.out / n).read_text(encoding="utf-8") != text
        ]
        for n in stale:
            print(f"stale: {(args.out / n).as_posix()} (run: python tools/gen_reference.py)", file=sys.stderr)
        return 1 if stale else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for n, text in pages.items():
        (args.out / n).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
