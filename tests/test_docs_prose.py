"""The repository's prose is written for a researcher reading it next year.

Over README.md, CHANGELOG.md, docs/ (records included) and the study files:
- no words about how the work was organised (the pattern below);
- a commit hash only on a provenance line: a line starting with "Provenance", a line of a
  ``!!! note "Provenance"`` box, or a row of a table with a "commit" column;
- every relative markdown link, and every repository path written in backticks, names a file that
  exists (outputs a run writes, such as ``runs/...`` and ``reports/...``, are not checked).

Over the sources (every ``.py`` file under lossscale_bench/, tests/, benchmarks/ and tools/, the shell
scripts and the comments of the YAML files under benchmarks/; this file, which holds the pattern, left out):
- the same words, on every line: docstrings and comments are prose too, and no code needs them;
- a commit hash only on a line starting with "Provenance" (after a comment's ``#``). Sources hold many
  hex words that are data (md5 sums, upstream commits of other projects, test digests); a word counts
  only when it names a commit of this repository (``git cat-file --batch-check``, one call for all
  words), so the check needs a git checkout and is skipped without one.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROCESS_TALK = re.compile(
    r"issue [0-9]+|\bitem [0-9]+\b|deliver [0-9]|(this|that|next|last|previous|earlier|first|second|third|"
    r"fourth|fifth|sixth|seventh|eighth|ninth|tenth) session|helpers'|\bthis turn\b",
    re.I,
)
HEX = re.compile(r"(?<![\w/.-])([0-9a-f]{7,40})(?![\w-])")
MD_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_PATH = re.compile(
    r"`([A-Za-z0-9_.][A-Za-z0-9_./-]*/[A-Za-z0-9_.-]+\.(?:py|md|ya?ml|toml|json|txt|sh|c|png|csv|cfg))`"
)
# written by a run, the user or the machine, not shipped: not checked
OUTPUT_PREFIXES = (
    "runs/",
    "reports/",
    "build/",
    "shared/",
    ".venv",
    "~",
    "/",
    "layers/",
    "plots/",
    "failed_attempts/",
    "trials/",
    "$",
    "<",
)


def _prose_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
    files += sorted((ROOT / "studies").rglob("*.yaml")) + sorted((ROOT / "lossscale_bench" / "studies").glob("*.yaml"))
    return [f for f in files if f.exists()]


def _source_files() -> list[Path]:
    files = [f for d in ("lossscale_bench", "tests", "benchmarks", "tools") for f in sorted((ROOT / d).rglob("*.py"))]
    files += [f for d in ("benchmarks", "tools") for ext in ("*.sh", "*.yaml") for f in sorted((ROOT / d).rglob(ext))]
    return [f for f in files if f.is_file() and f != Path(__file__).resolve()]


def _text_lines(path: Path) -> list[tuple[int, str]]:
    """Lines a reader reads: a YAML file's comments only, every line of a markdown, Python or shell file."""
    lines = path.read_text(encoding="utf-8").splitlines()
    if path.suffix == ".yaml":
        return [(i, line[line.index("#") :]) for i, line in enumerate(lines, 1) if "#" in line]
    return list(enumerate(lines, 1))


def _provenance_lines(path: Path) -> set[int]:
    """Line numbers that may carry a commit hash."""
    ok, in_box, commit_table = set(), False, False
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        stripped = line.strip().lstrip(">-*# ").strip()
        if re.match(r'!!! \w+ "Provenance', line):
            in_box = True
            ok.add(i)
            continue
        if in_box and (line.startswith("    ") or not line.strip()):
            ok.add(i)
            continue
        in_box = False
        if line.startswith("|"):
            if re.search(r"\|\s*commit\s*\|", line, re.I):
                commit_table = True
            if commit_table:
                ok.add(i)
        else:
            commit_table = False
        if stripped.startswith("Provenance"):
            ok.add(i)
    return ok


def _commits(words: set[str]) -> set[str]:
    """The words that name a commit of this repository."""
    words = sorted(words)
    r = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "--batch-check"],
        input="\n".join(words) + "\n",
        capture_output=True,
        text=True,
        check=True,
    )
    return {w for w, out in zip(words, r.stdout.splitlines()) if out.split()[1:2] == ["commit"]}


def _process_talk(files: list[Path]) -> list[str]:
    return [
        f"{f.relative_to(ROOT)}:{i}: {line.strip()[:120]}"
        for f in files
        for i, line in _text_lines(f)
        if PROCESS_TALK.search(line)
    ]


def test_no_process_talk():
    found = _process_talk(_prose_files())
    assert not found, "\n".join(found)


def test_no_process_talk_in_sources():
    found = _process_talk(_source_files())
    assert not found, "\n".join(found)


def _allowed_hash_lines(path: Path) -> set[int]:
    """Provenance lines: the markdown rules for markdown, a line starting with "Provenance" elsewhere."""
    if path.suffix == ".md":
        return _provenance_lines(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    return {i for i, line in enumerate(lines, 1) if line.strip().lstrip("#\"' ").startswith("Provenance")}


def _misplaced_commits(files: list[Path]) -> list[str]:
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode != 0:
        pytest.skip("not a git checkout: commits cannot be told from other hex words")
    hits = []
    for f in files:
        allowed = _allowed_hash_lines(f)
        for i, line in _text_lines(f):
            for word in HEX.findall(line):
                if re.search(r"\d", word) and re.search(r"[a-f]", word) and i not in allowed:
                    hits.append((f, i, word, line))
    commits = _commits({w for _, _, w, _ in hits})
    return [f"{f.relative_to(ROOT)}:{i}: {w} in {line.strip()[:100]}" for f, i, w, line in hits if w in commits]


def test_commit_hashes_only_on_provenance_lines():
    found = _misplaced_commits(_prose_files())
    assert not found, "\n".join(found)


def test_commit_hashes_in_sources_only_on_provenance_lines():
    found = _misplaced_commits(_source_files())
    assert not found, "\n".join(found)


def _exists(target: str, here: Path) -> bool:
    return any(p.exists() for p in (here / target, ROOT / target, ROOT / "lossscale_bench" / target))


def test_links_and_paths_resolve():
    missing = []
    for f in _prose_files():
        in_code = False
        for i, line in _text_lines(f):
            if line.lstrip().startswith("```"):
                in_code = not in_code
            if in_code:
                continue
            targets = []
            if f.suffix == ".md":
                targets += [t for t in MD_LINK.findall(line) if not re.match(r"[a-z]+:|#", t)]
            targets += [
                t
                for t in CODE_PATH.findall(line)
                if not t.startswith(OUTPUT_PREFIXES) and not re.search(r"[*<>{}$]", t)
            ]
            for t in targets:
                path = t.split("#", 1)[0]
                if path and not _exists(path, f.parent):
                    missing.append(f"{f.relative_to(ROOT)}:{i}: {t}")
    assert not missing, "\n".join(missing)
