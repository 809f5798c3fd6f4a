"""`python -m shardfuzz_worker.repro --target T --case CASE.json --inputs INPUTS.safetensors --bounds BOUNDS.json
--out DIR`: writes DIR/repro.py, prints the command that runs it (in DIR); exit status 2 when the target or the
case cannot be expressed."""

import argparse
import json
import sys

from . import ReproError, generate, write


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m shardfuzz_worker.repro", description=__doc__)
    ap.add_argument("--target", required=True)
    ap.add_argument("--case", required=True, help="the case (JSON)")
    ap.add_argument("--inputs", required=True, help="the inputs the fuzzer generated (safetensors)")
    ap.add_argument("--bounds", required=True, help='{"tensor": {"max": b, "rms": b, "norm": b}} (JSON)')
    ap.add_argument("--out", required=True, help="folder to write repro.py into")
    args = ap.parse_args(argv)
    from ..tensors_io import read_inputs

    with open(args.case) as f:
        case = json.load(f)
    with open(args.bounds) as f:
        bounds = json.load(f)
    inputs = read_inputs(args.inputs)
    try:
        text, command = generate(args.target, case, inputs, bounds)
    except ReproError as e:
        print(f"repro: {e}", file=sys.stderr)
        return 2
    write(args.out, text)
    print(command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
