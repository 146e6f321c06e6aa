"""transformer_engine.pytorch stand-in: any attribute is a class that refuses to be built."""

import types


class StandIn:
    def __init__(self, *args, **kwargs):
        raise RuntimeError(f"{type(self).__name__}: the Transformer Engine stand-in has no kernels (configuration checks only)")


def _standin(name: str) -> type:
    return type(name, (StandIn,), {"__module__": __name__})


class _Namespace(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _standin(name)
        setattr(self, name, value)
        return value


ops = _Namespace(__name__ + ".ops")


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _standin(name)
