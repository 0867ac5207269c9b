"""kvoffload/cli/args.py: a command's parser from its handler's docstring, and the shared flags."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from kvoffload.cli.args import add_actions, add_command, add_results_argument


def _handler(args: argparse.Namespace) -> int:
    """list the things

    Reads every thing of the folder and prints
    one line per thing, sorted.

    Exits 1 when the folder is empty.
    """
    return 0


def _undocumented(args: argparse.Namespace) -> int:
    return 0


def _tree() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction[argparse.ArgumentParser]]:
    top = argparse.ArgumentParser(prog="kvoffload-lab")
    return top, top.add_subparsers(dest="command", metavar="COMMAND")


def test_help_and_description_come_from_the_handlers_docstring() -> None:
    top, sub = _tree()
    parser = add_command(sub, "things", _handler)
    assert parser.description == (
        "Reads every thing of the folder and prints\none line per thing, sorted.\n\n"
        "Exits 1 when the folder is empty."
    )
    assert [a.help for a in sub._choices_actions] == ["list the things"]  # the command list's line
    # the CLI's formatter folds the docstring's line breaks: one paragraph, as the text reads
    folded = " ".join(parser.format_help().split())  # as wide as the terminal: compare the words
    assert "Reads every thing of the folder and prints one line per thing, sorted. Exits 1" in folded
    assert top.parse_args(["things"]).func is _handler


def test_help_and_description_given_win_over_the_docstring() -> None:
    _, sub = _tree()
    parser = add_command(sub, "things", _handler, help="other", description="laid out\n  by hand")
    assert parser.description == "laid out\n  by hand"
    assert [a.help for a in sub._choices_actions] == ["other"]


def test_a_command_made_of_actions_takes_its_help_as_given() -> None:
    top, sub = _tree()
    group = add_command(sub, "lab", help="the virtual lab")
    actions = add_actions(group, "lab_command")
    add_command(actions, "up", _handler)
    assert top.parse_args(["lab", "up"]).lab_command == "up"
    assert top.parse_args(["lab", "up"]).func is _handler
    with pytest.raises(SystemExit):  # the action is required
        top.parse_args(["lab"])


def test_a_command_without_any_help_is_refused() -> None:
    _, sub = _tree()
    with pytest.raises(ValueError, match="'bare': give `help`, or a docstring on its handler"):
        add_command(sub, "bare", _undocumented)
    with pytest.raises(ValueError, match="'group'"):
        add_command(sub, "group")


def test_results_flag_is_the_lab_commands_one() -> None:
    parser = argparse.ArgumentParser()
    add_results_argument(parser)
    assert parser.parse_args([]).results == Path("results")
    assert parser.parse_args(["--results", "out"]).results == Path("out")
    assert "results base folder (default ./results)" in parser.format_help()
