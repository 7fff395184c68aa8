"""Import-time stand-ins for packages sglang imports at module level but the parser never uses (triton,
torchvision). NOT the real packages: every attribute is a permissive placeholder, decorators return the function
unchanged. Put this directory on sys.path ONLY for tools/sglang_argcheck (check_argv.py, dump_options.py)."""
import importlib.abc
import importlib.machinery
import sys
import types

# Attribute paths that raise instead of returning a placeholder (code probing for a GPU then falls back to CPU).
RAISING = set()


def _child(parent, name):
    full = parent + "." + name
    if full in RAISING:
        raise AttributeError("%s: stand-in, no GPU runtime" % full)
    return full


class Anything:
    """Placeholder: callable, subscriptable, attribute-rich, usable as a base class and as a decorator."""

    def __init__(self, name="standin"):
        self._name = name

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return Anything(self._name + "()")

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Anything(_child(self._name, name))

    def __getitem__(self, key):
        return Anything(self._name + "[]")

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False

    def __mro_entries__(self, bases):
        return (object,)

    def __repr__(self):
        return "<standin %s>" % self._name


class StandinModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Anything(_child(self.__name__, name))


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots):
        self.roots = set(roots)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.roots and "." in fullname:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = StandinModule(spec.name)
        mod.__path__ = []
        return mod

    def exec_module(self, module):
        return None


def install(root, version, raising=()):
    RAISING.update(raising)
    mod = sys.modules[root]
    mod.__class__ = StandinModule
    mod.__version__ = version
    mod.__standin__ = True
    for f in sys.meta_path:
        if isinstance(f, _Finder):
            f.roots.add(root)
            return
    sys.meta_path.insert(0, _Finder([root]))
