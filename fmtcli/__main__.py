"""``python -m fmtcli``: the same command line as ``fmt``."""

from .cli import app

if __name__ == "__main__":
    app(prog_name="fmtcli")
