"""deploy/README.md's recipes are ones an operator can paste.

Each shell block of the page is read as the shell would read it (continuation
lines joined, comments dropped): every ``stager …`` command in it must parse with
stager's own parser, every ``install`` line must run as written (its absolute
destinations moved under a temporary directory), and the Slurm recipes must say
what an HPC admin found missing when following them (issue 26).  The token recipe
itself runs against a real cluster in ``tests/test_auth_cli.py``.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
import textwrap
from pathlib import Path

import pytest
from test_docs_links import _anchors, _prose

from stager.cli.main import build_parser

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "deploy" / "README.md"
_BLOCK = re.compile(r"^( *)```(?:sh|bash)\n(.*?)^\1```$", re.S | re.M)
_OPERATORS = set("();<>|&")
_RUNNERS = {"srun", "sudo", "exec", "nohup", "time"}   # then `stager` runs
_KEYWORDS = {"{", "!", "if", "then", "else", "elif", "while", "until", "do"}


def shell_blocks() -> list[str]:
    """The page's ``sh``/``bash`` blocks, dedented (some sit in list items)."""
    return [textwrap.dedent(body) for _, body in _BLOCK.findall(PAGE.read_text())]


def logical_lines(block: str) -> list[str]:
    """The block's commands as the shell reads them: ``\\``-continued lines joined,
    comment-only and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [line.strip() for line in joined.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def recipe_line(*words: str) -> str:
    """The one logical line of the page that holds every one of ``words``."""
    found = [line for block in shell_blocks() for line in logical_lines(block)
             if all(w in line for w in words)]
    assert len(found) == 1, (words, found)
    return found[0]


def _runs(command: list[str]) -> bool:
    """Whether the last word of a simple command's words so far is run as a command:
    the first word, or after a runner (``srun …``, ``docker exec NAME``, ``… --``)."""
    while len(command) > 1 and command[0] in _KEYWORDS:
        command = command[1:]
    return (len(command) == 1 or command[-2] == "--" or command[0] in _RUNNERS
            or command[:2] == ["docker", "exec"])


def stager_commands(line: str) -> list[list[str]]:
    """The argument lists of the ``stager`` commands in ``line``, also inside
    ``$(…)``; one that takes a function's ``$1``/``$@`` is skipped (a wrapper)."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    words = list(lex)
    found: list[list[str]] = []
    for word in words:
        for inner in re.findall(r"\$\((.*?)\)", word):
            found += stager_commands(inner)
    start = 0                       # where the current simple command begins
    for i, word in enumerate(words):
        if set(word) <= _OPERATORS:
            start = i + 1
        if word != "stager" or not _runs(words[start:i + 1]):
            continue
        args: list[str] = []
        for w in words[i + 1:]:
            if set(w) <= _OPERATORS:
                break
            args.append(w)
        if not any("$1" in a or "$@" in a for a in args):
            found.append(args)
    return found


def test_every_stager_command_in_the_page_parses() -> None:
    parser = build_parser()
    commands = [(line, args) for block in shell_blocks() for line in logical_lines(block)
                for args in stager_commands(line)]
    assert len(commands) >= 12          # the reader found them
    for line, args in commands:
        try:
            parser.parse_args(args)
        except SystemExit:
            pytest.fail(f"deploy/README.md: `stager {shlex.join(args)}` does not parse "
                        f"(in: {line})")


def test_every_install_line_runs_as_written(tmp_path: Path) -> None:
    """``install`` without ``-D`` fails where the directory is not there yet
    (``/etc/slurm/epilog.d``): each line runs from the checkout into an empty tree."""
    lines = [line for block in shell_blocks() for line in logical_lines(block)
             if line.startswith("install ")]
    assert len(lines) >= 5
    for line in lines:
        moved = re.sub(r"(?<=\s)/(etc|usr)/", lambda m: f"{tmp_path}/{m.group(1)}/", line)
        done = subprocess.run(["sh", "-c", moved], cwd=REPO, capture_output=True, text=True,
                              timeout=30)
        assert done.returncode == 0, f"{line}: {done.stderr}"
    epilog = tmp_path / "etc" / "slurm" / "epilog.d" / "stager.sh"
    assert stat.S_IMODE(epilog.stat().st_mode) == 0o755
    assert (tmp_path / "etc" / "slurm" / "burst_buffer.lua").is_file()
    assert (tmp_path / "etc" / "systemd" / "system" / "stager-data@.service").is_file()


def test_the_burst_buffer_recipe_restarts_slurmctld_and_names_the_token_lifetime() -> None:
    """`scontrol reconfigure` does not load a new BurstBufferType; a token without
    --ttl lives 24 h, and the hooks stop with it."""
    [block] = [b for b in shell_blocks() if "BurstBufferType=burst_buffer/lua" in b]
    lines = logical_lines(block)
    after = lines[next(i for i, line in enumerate(lines) if "BurstBufferType" in line):]
    assert any(line.startswith("systemctl restart slurmctld") for line in after), block
    assert not any("scontrol reconfigure" in line for line in lines), block
    [create] = [args for line in lines for args in stager_commands(line)
                if "create" in args]
    got = build_parser().parse_args(create)
    assert got.meta and got.token_file and got.out and got.ttl == "365d", create
    # nothing in the page writes a token through a pipe into a file
    assert not any(re.search(r"token create.*\|\s*tail -1\s*>", line)
                   for b in shell_blocks() for line in logical_lines(b))
    prose = _prose(PAGE)
    for said in ("teardown: token expired", "Error running\nslurm_bb_get_status",
                 "scontrol release JOBID", "bf_interval", "Permission denied"):
        assert said in prose, said


def test_every_job_up_in_the_page_gets_a_root_of_its_own() -> None:
    """``--root "${TMPDIR:-/tmp}/stager"`` was one root for every node sharing /tmp."""
    ups = [args for block in shell_blocks() for line in logical_lines(block)
           for args in stager_commands(line) if args[:2] == ["job", "up"]]
    assert len(ups) >= 2
    for args in ups:
        root = build_parser().parse_args(args).root
        assert root is None or ("SLURM_JOB_ID" in root and "SLURMD_NODENAME" in root), args


def test_the_page_links_resolve() -> None:
    anchors = _anchors(PAGE)
    for target in re.findall(r"\]\(([^)\s]+)\)", _prose(PAGE)):
        path, _, anchor = target.partition("#")
        if re.match(r"[a-z]+:", target):
            continue
        dest = (PAGE.parent / path).resolve() if path else PAGE
        assert dest.exists(), target
        assert not anchor or anchor in (anchors if not path else _anchors(dest)), target


def test_the_reader_reads_the_shell_as_the_shell_does() -> None:
    """The helpers above, on a line of each kind they must tell apart."""
    line = logical_lines('eval "$(stager job env)"  # x\n'
                         "until stager job env >/dev/null 2>&1; do sleep 1; done\n"
                         "admin() { kubectl exec m -- \\\n   stager --token-file f \"$@\"; }\n")
    assert [stager_commands(x) for x in line] == [[["job", "env"]], [["job", "env"]], []]
    assert os.path.basename(PAGE) == "README.md"
