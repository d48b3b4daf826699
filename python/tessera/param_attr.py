"""ParamAttr: how a layer names and initializes a parameter (like ``fluid.ParamAttr``)."""

from tessera import initializer as _init

__all__ = ["ParamAttr"]


class ParamAttr(object):
    """A parameter's name (None: the layer's default) and initializer (None: the default)."""

    def __init__(self, name=None, initializer=None):
        if name is not None and not isinstance(name, str):
            raise TypeError("ParamAttr name must be a str, got %r" % (name,))
        if initializer is not None and not isinstance(initializer, _init.Initializer):
            raise TypeError("ParamAttr initializer must be a tessera.initializer.Initializer, "
                            "got %r" % (initializer,))
        self.name = name
        self.initializer = initializer

    def __repr__(self):
        return "ParamAttr(name=%r, initializer=%r)" % (self.name, self.initializer)

    @staticmethod
    def to_attr(arg):
        """Normalizes None, a name, an Initializer or a ParamAttr to a ParamAttr."""
        if arg is None:
            return ParamAttr()
        if isinstance(arg, ParamAttr):
            return arg
        if isinstance(arg, str):
            return ParamAttr(name=arg)
        if isinstance(arg, _init.Initializer):
            return ParamAttr(initializer=arg)
        raise TypeError("expected a ParamAttr, a name or an Initializer, got %r" % (arg,))
