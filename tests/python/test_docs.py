"""The documentation's links and command lines: README.md and every docs/*.md.

What is checked:

(a) Links. Every inline link or image `[text](target)` / `![alt](target)` outside code (fenced
    blocks and `code spans` are left out) whose target is a relative path, with or without a
    `#anchor`, must name a file or folder that exists, resolved against the folder of the document
    that holds the link. http(s), mailto and other `scheme:` links and pure `#anchor` links are not
    checked, nor is the anchor part of a path link.

(b) Commands. Every command inside a ```bash (or sh / shell / console) fence that runs `ftbert` --
    the first word of the line, or of a command after `&&`, `||`, `;` or `|`, whose file name is
    `ftbert` (so `.venv/bin/ftbert run` counts) -- must parse: its arguments go through the same
    argument parsing the command runs, and nothing more (no model is loaded, no server started, no
    benchmark run):
      run, tune     ftbert.cli.main with the functions that would do the work (_run, _tune)
                    replaced by ones that only keep the parsed arguments;
      convert       ftbert.weights_tools.cli.build_parser().parse_args;
      bench         ftbert.bench.args.parse_options (argparse, a --preset's JSON, and the checks
                    that make a BenchError: options that do not go together, bad list values);
      serve         ftbert.serving.server.build_parser().parse_args, then settings_from_args
                    (the ServeSettings checks);
      bench-serve   ftbert.bench.serve's _parser().parse_args (its values are read later, by the
                    run itself, and are not checked here).
    Normalized first: backslash continuations are joined, `# comments` and a leading `$ ` prompt
    dropped, `...` and `[...]` (more arguments, left to the reader) removed, and an upper-case
    placeholder word (MODEL, SRC, DST, DIR, ...) replaced by the path of an existing, empty
    directory, as the user would write a real checkpoint folder there.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_FENCES = {"bash", "sh", "shell", "console"}
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")  # MODEL, SRC, DST, ...: a path the reader supplies
ELLIPSES = {"...", "[...]", "…"}
# Command separators of a shell line: every command after one is a command of its own.
SEPARATORS = {"&&", "||", ";", "|", "&"}


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# ---- reading the documents ---------------------------------------------------------------------
def split_fences(text: str):
    """(prose with fenced blocks blanked out, [(info string, first line number, [lines])])."""
    prose, blocks, block = [], [], None
    for number, line in enumerate(text.splitlines(), 1):
        fence = re.match(r"^\s*(```+|~~~+)\s*([^\s`]*)", line)
        if block is None and fence:
            block = (fence.group(1), fence.group(2).lower(), number + 1, [])
            prose.append("")
        elif block is not None:
            if line.strip().startswith(block[0]) and not line.strip().strip(block[0][0]):
                blocks.append(block[1:])
                block = None
            else:
                block[3].append(line)
            prose.append("")
        else:
            prose.append(line)
    assert block is None, f"a fenced block opened at line {block[2] - 1} is never closed"
    return prose, blocks


def links(path: Path):
    """(line number, target) of every inline link and image outside code."""
    prose, _ = split_fences(path.read_text(encoding="utf-8"))
    found = []
    for number, line in enumerate(prose, 1):
        line = re.sub(r"(`+).*?\1", "", line)  # code spans
        for m in re.finditer(r"\]\(\s*(<[^>]*>|[^)\s]*)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)", line):
            found.append((number, m.group(1).strip("<>")))
    return found


def relative_links():
    cases = []
    for doc in DOCS:
        for number, target in links(doc):
            if not target or target.startswith("#") or re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
                continue  # a pure #anchor, or http(s):, mailto:, ...
            cases.append(pytest.param(doc, number, target, id=f"{rel(doc)}:{number}:{target}"))
    return cases


def logical_lines(lines: list[str], first: int):
    """(line number, line) with backslash continuations joined."""
    out, pending, start = [], "", first
    for number, line in enumerate(lines, first):
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append((start, pending + line))
        pending = ""
    if pending:
        out.append((start, pending))
    return out


def commands(line: str) -> list[list[str]]:
    """The commands of one shell line, as words (comments dropped, split at && || ; | &)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    out: list[list[str]] = [[]]
    for word in lexer:
        if word in SEPARATORS:
            out.append([])
        else:
            out[-1].append(word)
    return [c for c in out if c]


def ftbert_commands_in(path: Path):
    """(line number, the words after `ftbert`) of every ftbert command in the shell fences."""
    found = []
    _, blocks = split_fences(path.read_text(encoding="utf-8"))
    for info, first, lines in blocks:
        if info not in SHELL_FENCES:
            continue
        for number, line in logical_lines(lines, first):
            line = re.sub(r"^\s*\$\s", "", line)
            for words in commands(line):
                while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
                    words = words[1:]  # VAR=value before the command
                if words and Path(words[0]).name == "ftbert":
                    found.append((number, words[1:]))
    return found


def ftbert_commands():
    return [pytest.param(words, id=f"{rel(doc)}:{number}:ftbert {' '.join(words)}")
            for doc in DOCS for number, words in ftbert_commands_in(doc)]


LINKS = relative_links()
COMMANDS = ftbert_commands()


# ---- (a) links ---------------------------------------------------------------------------------
def test_the_documents_are_found_and_hold_links_and_commands():
    # Guards the two checks below against passing because the extraction found nothing.
    assert (ROOT / "README.md").is_file() and len(DOCS) > 1
    assert LINKS, "no relative links found in README.md and docs/*.md"
    assert COMMANDS, "no `ftbert ...` command lines found in the bash blocks of README.md and docs/*.md"


def check_link(doc: Path, line: int, target: str) -> None:
    path = unquote(target.split("#", 1)[0].split("?", 1)[0])
    resolved = (doc.parent / path).resolve()
    assert resolved.exists(), (f"{doc.name}:{line}: the link ({target}) names {path}, which does not "
                               f"exist (looked for {resolved})")


@pytest.mark.parametrize("doc,line,target", LINKS)
def test_relative_link_resolves(doc, line, target):
    check_link(doc, line, target)


def test_links_are_read_outside_code_and_a_broken_one_fails(tmp_path):
    (tmp_path / "there.md").write_text("# Title\n")
    doc = tmp_path / "doc.md"
    doc.write_text("See [there](there.md#title), ![a plot](<there.md> \"title\") and [web](https://x.y).\n"
                   "`[not a link](code.md)`\n"
                   "```bash\n"
                   "echo '[nor this](fenced.md)'\n"
                   "```\n"
                   "[gone](missing.md#part) and [here](#title)\n")
    assert links(doc) == [(1, "there.md#title"), (1, "there.md"), (1, "https://x.y"), (6, "missing.md#part"),
                          (6, "#title")]
    check_link(doc, 1, "there.md#title")
    with pytest.raises(AssertionError, match="missing.md"):
        check_link(doc, 6, "missing.md#part")


# ---- (b) command lines -------------------------------------------------------------------------
@contextlib.contextmanager
def parse_errors(words: list[str]):
    """argparse reports a bad command line by printing to stderr and exiting: that becomes a test
    failure that quotes what it printed."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            yield
    except SystemExit as e:
        pytest.fail(f"`ftbert {' '.join(words)}` does not parse (exit {e.code}): {err.getvalue().strip()}")


def parse_run_or_tune(argv: list[str], monkeypatch) -> None:
    from ftbert import cli

    parsed = []

    def keep(args):
        parsed.append(args)
        return 0

    monkeypatch.setattr(cli, "_run", keep)
    monkeypatch.setattr(cli, "_tune", keep)
    assert cli.main(argv) == 0
    assert len(parsed) == 1 and parsed[0].command == argv[0]


def parse_convert(argv: list[str]) -> None:
    from ftbert.weights_tools.cli import build_parser

    build_parser().parse_args(argv)


def parse_bench(argv: list[str]) -> None:
    from ftbert.bench.args import BenchError, parse_options

    try:
        parse_options(argv, cuda_available=True)
    except BenchError as e:
        pytest.fail(f"`ftbert bench {' '.join(argv)}` is refused: {e}")


def parse_serve(argv: list[str]) -> None:
    from ftbert.serving.server import build_parser, settings_from_args

    args = build_parser().parse_args(argv)
    try:
        settings_from_args(args)
    except ValueError as e:
        pytest.fail(f"`ftbert serve {' '.join(argv)}` is refused: {e}")


def parse_bench_serve(argv: list[str]) -> None:
    from ftbert.bench.serve import _parser

    _parser().parse_args(argv)


PARSERS = {"convert": parse_convert, "bench": parse_bench, "serve": parse_serve,
           "bench-serve": parse_bench_serve}


def normalized(words: list[str], placeholder_dir: Path) -> list[str]:
    return [str(placeholder_dir) if PLACEHOLDER.match(w) else w for w in words if w not in ELLIPSES]


def check_command(words: list[str], placeholder_dir: Path, monkeypatch) -> None:
    """Fails the test when `ftbert WORDS` does not parse (see the module's docstring)."""
    argv = normalized(words, placeholder_dir)
    assert argv, "`ftbert` alone is not a documented command: it needs a subcommand"
    with parse_errors(words):
        if argv[0] in PARSERS:
            PARSERS[argv[0]](argv[1:])
        elif argv[0] in ("run", "tune"):
            parse_run_or_tune(argv, monkeypatch)
        else:
            pytest.fail(f"`ftbert {argv[0]}` is not a subcommand of ftbert.cli "
                        f"(known: run, tune, {', '.join(PARSERS)})")


def test_commands_are_read_from_shell_fences_only(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("ftbert serve --in-prose\n"
                   "```bash\n"
                   "pip install ftbert && .venv/bin/ftbert run 'two words'  # a comment\n"
                   "$ FTBERT_CACHE_DIR=/tmp/c ftbert bench --batch 1 \\\n"
                   "    --seq 8 | tee log\n"
                   "echo ftbert convert\n"
                   "```\n"
                   "```python\n"
                   "ftbert serve --in-python\n"
                   "```\n")
    assert ftbert_commands_in(doc) == [(3, ["run", "two words"]), (4, ["bench", "--batch", "1", "--seq", "8"])]
    assert normalized(["serve", "MODEL", "--devices", "cuda:0,cuda:1", "...", "--port", "8000"], tmp_path) == [
        "serve", str(tmp_path), "--devices", "cuda:0,cuda:1", "--port", "8000"]


@pytest.mark.parametrize("words", COMMANDS)
def test_documented_command_parses(words, tmp_path, monkeypatch):
    check_command(words, tmp_path, monkeypatch)


@pytest.mark.parametrize("words", [
    ["run", "--no-such-option"], ["run", "MODEL", "--dtype", "float64"],
    ["tune", "MODEL", "--no-such-option"], ["tune"],
    ["convert", "SRC", "DST", "--no-such-option"], ["convert", "SRC"],
    ["bench", "--no-such-option"], ["bench", "--rerank", "--seq", "128"],
    ["bench", "--preset", "no-such-preset"],
    ["serve", "--no-such-option"], ["serve", "MODEL", "--max-batch-size", "0"],
    ["bench-serve", "--no-such-option"], ["bench-serve", "--duration", "long"],
    ["no-such-subcommand"],
], ids=" ".join)
def test_a_command_that_does_not_parse_fails_the_check(words, tmp_path, monkeypatch):
    # The check above can fail: options no parser has, values a parser refuses, a missing argument.
    with pytest.raises(pytest.fail.Exception):
        check_command(words, tmp_path, monkeypatch)
