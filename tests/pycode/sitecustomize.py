"""A bytecode cache for the modules Ansible runs from a zip, for the test runs' interpreters only.

Every task ships its module and module_utils to the host as an AnsiballZ zip of sources. Python never caches
bytecode for a zip, so each of the about 2000 module runs of `make integration` compiled ansible.module_utils.basic,
community.docker's API client and ours again (a docker_container_info run: 0.45 CPU-s, 0.19 with this;
docs/test-time.md). Here the code compiled from a zip is kept under GPUBOX_PYCODE_CACHE, keyed by the interpreter's
magic number and the source's hash, and given back with the zip's path as its file name: the same code, run the same
way, compiled once.

tests/conftest.py puts this folder first on PYTHONPATH for the Ansible runs it starts; nothing else loads it.
"""

import hashlib
import os
import zipimport

try:
    import _imp
    import marshal
    from importlib.util import MAGIC_NUMBER
except ImportError:  # not CPython: compile as Python does
    _imp = None


def _install(folder: str) -> None:
    compile_source = zipimport._compile_source

    def cached(pathname, source):
        key = hashlib.sha256(MAGIC_NUMBER + source).hexdigest()
        path = os.path.join(folder, key[:2], key)
        try:
            with open(path, "rb") as stored:
                code = marshal.load(stored)
            if not isinstance(code, type(cached.__code__)):
                raise ValueError(path)
        except (OSError, EOFError, ValueError, TypeError):
            code = compile_source(pathname, source)
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                partial = f"{path}.{os.getpid()}"
                with open(partial, "wb") as out:
                    marshal.dump(code, out)
                os.replace(partial, path)
            except OSError:
                pass
            return code
        _imp._fix_co_filename(code, pathname)
        return code

    zipimport._compile_source = cached


# zipimport._compile_source is CPython's own (3.8 to 3.13); where it is missing, modules compile as they always did.
if _imp is not None and hasattr(zipimport, "_compile_source") and os.environ.get("GPUBOX_PYCODE_CACHE"):
    _install(os.environ["GPUBOX_PYCODE_CACHE"])
