"""`kvoffload-lab sim serve|cache-server`: the GPU-free stand-ins for `vllm serve` and `lmcache server`.

Everything after the sub-command is handed, unparsed, to the simulator's own copies of the vLLM and
LMCache command lines (`kvoffload.sim.engine_args`, `kvoffload.sim.cache_args`), so role templates pass
the same flags to the simulator as to the real binaries.
"""

from __future__ import annotations

import argparse

from kvoffload.cli.args import add_actions, add_command
from kvoffload.errors import UserError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = add_command(
        subparsers,
        "sim",
        help="simulated vLLM engine and LMCache server (no GPU needed)",
        description="GPU-free stand-ins for `vllm serve` and `lmcache server` (docs/simulator.md).",
    )
    sub = add_actions(parser, "sim_command", metavar="SIM_COMMAND")
    # every token, --help included, goes to the vLLM-style (or LMCache-style) parser
    serve = add_command(sub, "serve", _serve, add_help=False, prefix_chars="\x00")
    serve.add_argument("vllm_args", nargs=argparse.REMAINDER)
    cache = add_command(sub, "cache-server", _cache_server, add_help=False, prefix_chars="\x00")
    cache.add_argument("lmcache_args", nargs=argparse.REMAINDER)


def _check_port(flag: str, port: int) -> None:
    # Out of range, a port is not refused everywhere: getaddrinfo wraps 70000 to 4464.
    if not 1 <= port <= 65535:
        raise UserError(f"{flag} {port}: must be a TCP port 1-65535")


def _wants_help(argv: list[str]) -> bool:
    return any(word in ("-h", "--help") for word in argv)


def _print_help(parser: argparse.ArgumentParser, prog: str, mimics: str) -> int:
    """The simulator's own help under this CLI's name (its errors keep the real binary's wording)."""
    parser.prog = prog
    parser.usage = f"{prog} {parser.usage.split(' ', 2)[2] if parser.usage else '[options]'}"
    parser.description = f"{parser.description} Takes the flags of `{mimics}`."
    parser.print_help()
    return 0


def _serve(args: argparse.Namespace) -> int:
    """simulated `vllm serve MODEL [flags] [--sim-profile NAME|PATH]`"""
    from kvoffload.sim.engine_args import build_parser, parse_engine_args
    from kvoffload.sim.engine_server import serve

    if _wants_help(args.vllm_args):
        return _print_help(build_parser(), "kvoffload-lab sim serve", "vllm serve")
    engine = parse_engine_args(list(args.vllm_args))
    _check_port("--port", engine.port)
    return serve(engine)


def _cache_server(args: argparse.Namespace) -> int:
    """simulated `lmcache server [flags] [--sim-profile NAME|PATH] [--sim-l2-scale N]`"""
    from kvoffload.sim.cache_args import build_parser, parse_cache_args
    from kvoffload.sim.cache_server import serve_cache

    if _wants_help(args.lmcache_args):
        return _print_help(build_parser(), "kvoffload-lab sim cache-server", "lmcache server")
    cache = parse_cache_args(list(args.lmcache_args))
    _check_port("--port", cache.port)
    _check_port("--http-port", cache.http_port)
    return serve_cache(cache)
