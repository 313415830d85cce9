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
    r"fourth|fifth|sixth|seventh|eighth|ninth|tenth) session|helpers'|\bthis turn\b"
    # the people and tools that did the work, and the notes they worked from
    # (a hyphen on either side leaves the word alone: Ray's flags such as ``--dashboard-agent-listen-port``)
    r"|(?<!User-)(?<!-)\bagents?\b(?!-)|device tool|\bthe issue\b|\bissue-[0-9]+|\bthe brief\b|\bthat day's\b"
    # "seed" for the published study and its code, which a page about random seeds cannot tell apart
    r"|(?<![-\w])seeds?(?:'s|s'|')? (?:study|studies|tables?|recipes?|code|paper|documents?|repo|repository|"
    r"project|tutorial|file|references?|row labels|ssd recipe|trains|published)\b|\bseeds? ran (?:it\b|`)"
    r"|\bseed[- ]0\d\d\b|\bseeds'? `+mpiexec|\bas in the seeds\b",
    re.I,
)
# a path on the machine the work was done on, or beside the checkout: a reader has neither
OUTSIDE_PATH = re.compile(r"/work/|(?<![\w.])\.\./(?:\.\./)*shared/")
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
    files.append(ROOT / "Makefile")
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


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _process_talk(files: list[Path], pattern: re.Pattern = PROCESS_TALK) -> list[str]:
    return [f"{_rel(f)}:{i}: {line.strip()[:120]}" for f in files for i, line in _text_lines(f) if pattern.search(line)]


def test_no_process_talk():
    found = _process_talk(_prose_files())
    assert not found, "\n".join(found)


def test_no_paths_outside_the_repository():
    """A page or a study's comment names paths a reader has: in the repository, or one they choose."""
    found = _process_talk(_prose_files(), OUTSIDE_PATH)
    assert not found, "\n".join(found)


#: phrases that were in the tree, each of which the checks above must catch (planted into a copy below)
PLANTED = [
    "while two other agents were running tests",
    "the agent ran it",
    "the device tool's 64 MiB",
    "within the issue's 15 minutes",
    "the NCHW slow path the issue-9 entry measured",
    "the function name the brief uses",
    "21.41 in that day's README",
    "the seed's row labels",
    "the seeds' `mpiexec -n 8`",
    "as in the seeds.",
    "the seed study's --dynamic-interval 10",
    "the seed tables' 1, 8, 128, 256",
    "optimizer of the seed recipes",
    "a seed's reference does it that way",
    "The seed ran it with `mpiexec -n 8`",
    "the seed trains with 128 images per card",
    "the seed's tutorial stops",
    "Seed 000, first table",
    "the base of Habana's seed-003 model",
    "The seed's published table",
]
#: what the checks must leave alone: random seeds, and words that only look alike
NOT_PLANTED = [
    "the 12-seed study's verdicts",
    "the seed ran once",
    "seed 0: 21.41",
    "User-Agent",
    "per seed",
    "seed noise",
]
OUTSIDE = ["photos in /work/shared/data/kangaroo", "root: ../../shared/data/kangaroo"]


def _planted(tmp: Path, name: str, phrase: str) -> Path:
    """A copy of a tree file with one more line holding the phrase (a comment in a YAML file)."""
    src = ROOT / name
    dst = tmp / name
    dst.parent.mkdir(parents=True, exist_ok=True)
    prefix = "# " if src.suffix == ".yaml" else ""
    dst.write_text(src.read_text(encoding="utf-8") + f"\n{prefix}{phrase}\n", encoding="utf-8")
    return dst


@pytest.mark.parametrize("name", ["docs/index.md", "studies/ssd512_bs8.yaml", "lossscale_bench/cli.py"])
def test_each_phrase_planted_into_a_copy_is_caught(tmp_path, name):
    assert not _process_talk([ROOT / name]) and not _process_talk([ROOT / name], OUTSIDE_PATH)
    for phrase in PLANTED:
        found = _process_talk([_planted(tmp_path, name, phrase)])
        assert len(found) == 1 and phrase[:40] in found[0], (phrase, found)
    for phrase in OUTSIDE:
        found = _process_talk([_planted(tmp_path, name, phrase)], OUTSIDE_PATH)
        assert len(found) == 1, (phrase, found)
    for phrase in NOT_PLANTED:
        assert not _process_talk([_planted(tmp_path, name, phrase)]), phrase


def test_studies_that_need_photos_say_how_to_get_them():
    """A study whose dataset lies outside the repository says, in its comments, where to get it."""
    lacking = []
    for f in sorted((ROOT / "studies").rglob("*.yaml")):
        text = f.read_text(encoding="utf-8")
        data = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
        comments = " ".join(line for _, line in _text_lines(f))
        if re.search(r"root: \.\./", data) and "docs/guide/data.md" not in comments:
            lacking.append(_rel(f))
    assert not lacking, lacking


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


DOCS_PATH = re.compile(r"(?<![\w/.-])docs/[\w./-]+\.md\b")


def test_docs_pages_named_in_sources_exist():
    """A docstring or comment that sends the reader to a page names one that exists."""
    missing = [
        f"{_rel(f)}:{i}: {m}"
        for f in _source_files()
        for i, line in _text_lines(f)
        for m in DOCS_PATH.findall(line)
        if not (ROOT / m).exists()
    ]
    assert not missing, "\n".join(missing)


def test_no_escaped_pipe_in_code():
    """``\\|`` in a code span prints as itself on the site (a table's pipe in code: ``<code>a &#124; b</code>``)."""
    found = [
        f"{_rel(f)}:{i}: {line.strip()[:100]}"
        for f in sorted((ROOT / "docs").rglob("*.md"))
        for i, line in _text_lines(f)
        if any("\\|" in span for span in re.findall(r"`[^`]+`", line))
    ]
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
