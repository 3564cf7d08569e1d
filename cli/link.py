"""``edgespec link``: emulate a network link (delay, jitter, bandwidth, loss, faults) as a TCP proxy.

    edgespec link --listen 9100 --upstream 127.0.0.1:9000 --link 4g
    edgespec link --listen 9100 --upstream 127.0.0.1:9000 --rtt 80 --jitter 10 --bandwidth 5 --loss 0.5

Runs until Ctrl-C; SIGUSR1 resets every connection, SIGUSR2 stalls forwarding
(see edgespec.cloud.link.emulator).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time

from edgespec.cli.flags import add_deprecated
from edgespec.cloud.link.emulator import LinkEmulator
from edgespec.cloud.link.profiles import PROFILES, Faults, LinkProfile, get_profile


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", required=True, help="[HOST:]PORT to accept connections on (HOST defaults to 127.0.0.1)")
    parser.add_argument("--upstream", required=True, help="HOST:PORT to forward to (the Serve gRPC proxy)")
    parser.add_argument("--link", choices=sorted(PROFILES), help="a named link profile; the flags below override its fields")
    add_deprecated(parser, "--profile", "--link", "link")
    parser.add_argument("--rtt", type=float, help="base round-trip time, ms")
    parser.add_argument("--jitter", type=float, help="mean extra round-trip delay, ms")
    parser.add_argument("--jitter-shape", choices=["exponential", "uniform", "halfnormal"])
    parser.add_argument("--bandwidth", type=float, help="Mbit/s in each direction (0 = unlimited)")
    parser.add_argument("--bandwidth-up", type=float, help="Mbit/s device -> cloud (overrides --bandwidth)")
    parser.add_argument("--bandwidth-down", type=float, help="Mbit/s cloud -> device (overrides --bandwidth)")
    parser.add_argument("--loss", type=float, help="per-segment loss, percent (seen as retransmission stalls)")
    parser.add_argument("--reset-after", type=float, metavar="S", help="reset each connection S seconds after it opens")
    parser.add_argument("--stall-every", type=float, metavar="S", help="pause forwarding every S seconds ...")
    parser.add_argument("--stall-for", type=float, metavar="S", help="... for S seconds (also the SIGUSR2 stall length; default 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the jitter and loss draws")
    parser.add_argument("--report-every", type=float, default=5.0, metavar="S", help="print counters every S seconds (0 = never)")


def profile_from_args(args: argparse.Namespace) -> LinkProfile:
    base = get_profile(args.link) if args.link else LinkProfile("custom")
    changes = {
        "rtt_ms": args.rtt,
        "jitter_ms": args.jitter,
        "jitter_shape": args.jitter_shape,
        "loss_pct": args.loss,
        "bandwidth_up_mbit": args.bandwidth_up if args.bandwidth_up is not None else args.bandwidth,
        "bandwidth_down_mbit": args.bandwidth_down if args.bandwidth_down is not None else args.bandwidth,
    }
    changes = {k: v for k, v in changes.items() if v is not None}
    if changes and args.link:
        changes["name"] = f"{args.link}+custom"
    return base.replace(**changes) if changes else base


def run(args: argparse.Namespace) -> int:
    listen_host, _, port_text = args.listen.rpartition(":")
    try:
        if not port_text.isdigit():
            raise ValueError(f"--listen must be [HOST:]PORT, got {args.listen!r}")
        profile = profile_from_args(args)
        faults = Faults(
            reset_after_s=args.reset_after,
            stall_every_s=args.stall_every,
            stall_for_s=args.stall_for if args.stall_every is not None else None,
        )
        emulator = LinkEmulator(
            args.upstream, profile, listen_port=int(port_text), listen_host=listen_host or "127.0.0.1",
            seed=args.seed, faults=faults,
        )
    except ValueError as exc:
        print(f"edgespec link: {exc}", file=sys.stderr)
        return 2
    on_demand_stall_s = args.stall_for or 1.0
    with emulator:
        print(f"edgespec link: {emulator.address} -> {emulator.upstream[0]}:{emulator.upstream[1]}", flush=True)
        print(f"  profile  {profile.describe()}", flush=True)
        if faults != Faults():
            print(f"  faults   {faults}", flush=True)
        print(f"  signals  SIGUSR1 (kill -USR1 <pid>) resets every connection; SIGUSR2 stalls {on_demand_stall_s:g} s", flush=True)
        signal.signal(signal.SIGUSR1, lambda *_: print(f"reset {emulator.reset_all()} connection(s)", flush=True))
        signal.signal(signal.SIGUSR2, lambda *_: emulator.stall(on_demand_stall_s))
        try:
            while True:
                time.sleep(args.report_every if args.report_every > 0 else 3600)
                if args.report_every > 0:
                    print(f"[{time.strftime('%H:%M:%S')}] {emulator.stats.line()}", flush=True)
        except KeyboardInterrupt:
            print(f"stopping: {emulator.stats.line()}", flush=True)
    return 0
