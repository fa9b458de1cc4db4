#!/usr/bin/env python3
"""Regenerates README.md's speed tables from bench/results/latest.json (written by
bench/run.py): the text between `<!-- bench:begin -->` and `<!-- bench:end -->` is replaced by
the run's Markdown report and its issue-11 targets table. Run it after `python3 bench/run.py`:

    python3 bench/readme.py [--json bench/results/latest.json] [--readme README.md]
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import run  # noqa: E402

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=os.path.join(HERE, "results", "latest.json"))
    ap.add_argument("--readme", default=os.path.join(run.ROOT, "README.md"))
    args = ap.parse_args()
    with open(args.json) as f:
        res = json.load(f)
    with open(args.readme) as f:
        text = f.read()
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise SystemExit(f"{args.readme}: needs one {BEGIN} ... {END} section")
    body = run.markdown(res)
    new = text[:text.index(BEGIN) + len(BEGIN)] + "\n" + body + "\n" + text[text.index(END):]
    with open(args.readme, "w") as f:
        f.write(new)
    print(f"{args.readme}: speed tables from {args.json} ({res['started_at']}, "
          f"commit {res['commit']['sha'][:12]})")


if __name__ == "__main__":
    main()
