"""``python -m fmtcli``: the same command line as ``fmt``."""

from fmtcli.cli import main

if __name__ == "__main__":
    main(prog_name="fmtcli")
