"""Stand-in for the get-pip.py bootstrap script that ansible-test downloads.

ansible-test fetches get-pip.py from a host that is not reachable from these
machines. It runs the script inside a new venv with pip-style arguments, e.g.
``pip==24.2 --disable-pip-version-check --no-setuptools --no-wheel``. This
stand-in does the same job with what Python ships: ``ensurepip`` puts a pip in
the venv, then that pip installs the requested packages from the package index.
scripts/sanity.sh copies it to ansible-test's cache path.
"""

import subprocess
import sys

GET_PIP_ONLY = {"--no-setuptools", "--no-wheel"}


def main() -> None:
    args = [a for a in sys.argv[1:] if a not in GET_PIP_ONLY]
    subprocess.check_call([sys.executable, "-m", "ensurepip", "--upgrade", "--default-pip"], stdout=subprocess.DEVNULL)
    subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet", *args])


if __name__ == "__main__":
    main()
