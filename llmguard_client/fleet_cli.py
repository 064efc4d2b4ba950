"""``llmguard-rollout get|set FRACTION|kill|clear --fleet URL --name NAME``: the fleet-wide rollout flag.

The runtime's one command (``llmguard rollout`` in llmguard-tools is the same): the kill switch is part of
operating the library, so a host with only the runtime installed has it.

``set`` writes the guarded fraction (and lifts the kill switch), ``kill`` guards no call anywhere until the
next ``set``, ``clear`` marks both unset (each process goes back to its own ``Guard(rollout=...)``); ``get``
prints what is stored. Each change is announced, so running processes follow at once, and within their
``rollout_poll_interval`` at the latest (`llmguard_client._fleet.flag`): a value stored whose announcement
failed is a success, with a warning saying so. A store that refuses the command (a permission, a password) is
named as refusing it; "did not answer" is for one that did not answer.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from typing import Any

from llmguard_client._fleet.flag import UNSET, parse_flag
from llmguard_client._fleet.url import FleetURL, check_name, parse_fleet_url, redact_text

__all__ = ["FleetCommandError", "add_parser", "check_fleet_url", "main", "run"]

PROG = "llmguard-rollout"

TIMEOUT = 5.0
"""Seconds to connect and for each command (a person waits, not a call)."""

POLL_INTERVAL = 5.0
"""``Guard(rollout_poll_interval=...)``'s default: how late a process follows a change it was not told of."""


class FleetCommandError(Exception):
    """The store could not be reached or refused the command: reported as one line, exit status 1."""


def check_fleet_url(url: str) -> str:
    """``url`` checked as ``Guard(fleet=url)`` checks it, before anything connects: returned as given, or a
    `llmguard_client.errors.GuardConfigError` naming what is wrong (password masked) and what is accepted."""
    parse_fleet_url(url)
    return url


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction from 0.0 to 1.0, got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be from 0.0 to 1.0 (e.g. 0.10), got {text}")
    return value


DESCRIPTION = (
    "Read or change the guarded fraction and the kill switch that every process of one "
    "Guard(fleet=..., name=...) follows (docs/fleet.md)."
)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``rollout`` on a command line's subparsers (``llmguard rollout`` in llmguard-tools)."""
    r: argparse.ArgumentParser = sub.add_parser(
        "rollout", help="the fleet-wide rollout flag: get, set FRACTION, kill, clear", description=DESCRIPTION
    )
    _add_arguments(r)
    return r


def _add_arguments(r: argparse.ArgumentParser) -> None:
    r.add_argument("action", choices=("get", "set", "kill", "clear"))
    r.add_argument("fraction", nargs="?", type=_fraction, help="for set: the fraction of calls to guard (0.0-1.0)")
    r.add_argument("--fleet", required=True, metavar="URL", help="the fleet store (redis://, rediss://, ...)")
    r.add_argument("--name", required=True, help="the Guard's name=..., e.g. checkout")


def main(argv: Sequence[str] | None = None) -> int:
    """``llmguard-rollout``: bad input exits 2, a store that does not answer or refuses the command 1, each with
    one line on stderr."""
    from llmguard_client.errors import GuardConfigError

    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION)
    _add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (GuardConfigError, FleetCommandError) as exc:
        print(f"{PROG}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2 if isinstance(exc, GuardConfigError) else 1


def run(args: argparse.Namespace, prog: str = PROG) -> int:
    """Run the command; raises `llmguard_client.errors.GuardConfigError` for bad input, `FleetCommandError`
    for a store that did not answer or refused. A warning on stderr starts with ``prog``."""
    from llmguard_client.errors import GuardConfigError

    url = parse_fleet_url(args.fleet)
    name = check_name(args.name)
    if args.action == "set" and args.fraction is None:
        raise GuardConfigError("rollout set needs a FRACTION (e.g. 'rollout set 0.10'); the others take none")
    if args.action != "set" and args.fraction is not None:
        raise GuardConfigError(
            f"rollout {args.action} takes no FRACTION, got {args.fraction:g}; only set does (e.g. 'rollout set 0.10')"
        )
    unannounced: list[tuple[bool, str]] = []
    try:
        print(asyncio.run(_apply(url, name, args.action, args.fraction, unannounced)))
    except Exception as exc:
        if isinstance(exc, GuardConfigError):
            raise
        refused, detail = _failure(exc, url)
        raise FleetCommandError(
            f"the fleet store {url.redacted} {'refused the command' if refused else 'did not answer'}: {detail}"
        ) from None
    for refused, detail in unannounced:  # stored all the same: the processes read it at their next poll
        print(
            f"{prog}: warning: stored, but the announcement to the running processes "
            f"{'was refused' if refused else 'got no answer'} ({detail}); they follow at their next read of the "
            f"flag, within their rollout_poll_interval ({POLL_INTERVAL:g} s by default)",
            file=sys.stderr,
        )
    return 0


def _failure(exc: Exception, url: FleetURL) -> tuple[bool, str]:
    """Whether the store refused (no permission, a read-only replica, a wrong password) rather than did not
    answer (no connection, no answer in time), and what it said, credentials masked."""
    detail = redact_text(f"{type(exc).__name__}: {exc}", url)
    try:
        from redis.exceptions import AuthenticationError, AuthorizationError, ResponseError
    except ImportError:  # no redis-py: no client was made, nothing was refused
        return False, detail
    return isinstance(exc, (ResponseError, AuthenticationError, AuthorizationError)), detail


async def _apply(
    url: FleetURL, name: str, action: str, fraction: float | None, unannounced: list[tuple[bool, str]]
) -> str:
    """Run ``action``; the reason an announcement failed after the values were stored goes to ``unannounced``."""
    prefix = f"llmguard:{name}:"
    keys = (prefix + "rollout:fraction", prefix + "rollout:kill")
    client = url.client(socket_timeout=TIMEOUT, connect_timeout=TIMEOUT)
    try:
        # Written, never deleted: a key that is missing means a store that lost it (a restarted Redis), which
        # the processes fill again with what they last read; a deleted key would be filled with the old value.
        if action == "set":
            await client.set(keys[0], repr(fraction))
            await client.set(keys[1], "0")
        elif action == "kill":
            await client.set(keys[1], "1")
        elif action == "clear":
            await client.set(keys[0], UNSET)
            await client.set(keys[1], "0")
        if action != "get":
            try:
                await client.publish(url.channel(prefix + "rollout"), action)
            except Exception as exc:  # the value is stored: not a failure of the command
                unannounced.append(_failure(exc, url))
        stored, kill = await client.get(keys[0]), await client.get(keys[1])
    finally:
        await client.aclose()
    value = parse_flag(stored, kill)
    killed = parse_flag(None, kill) == 0.0
    if value is None:
        return f"{name}: no fleet-wide rollout set; each process uses its own Guard(rollout=...)"
    stored_text = stored.decode() if isinstance(stored, bytes) else UNSET if stored is None else str(stored)
    return (
        f"{name}: {value:g} of calls guarded on every process "
        f"(fraction {stored_text}, kill switch {'ON' if killed else 'off'})"
    )


if __name__ == "__main__":
    sys.exit(main())
