"""ParamAttr: how a layer names and initializes a parameter (like ``fluid.ParamAttr``)."""

from tessera import initializer as _init

__all__ = ["ParamAttr"]


class ParamAttr(object):
    """A parameter's name (None: the layer's default), initializer (None: the default) and, for
    an embedding table, an optimizer of its own (a tessera.optimizer.Optimizer; None: the
    model's)."""

    def __init__(self, name=None, initializer=None, optimizer=None):
        if name is not None and not isinstance(name, str):
            raise TypeError("ParamAttr name must be a str, got %r" % (name,))
        if initializer is not None and not isinstance(initializer, _init.Initializer):
            raise TypeError("ParamAttr initializer must be a tessera.initializer.Initializer, "
                            "got %r" % (initializer,))
        from tessera import optimizer as _opt  # optimizer imports the framework
        if optimizer is not None and not isinstance(optimizer, _opt.Optimizer):
            raise TypeError("ParamAttr optimizer must be a tessera.optimizer.Optimizer, got %r" %
                            (optimizer,))
        self.name = name
        self.initializer = initializer
        self.optimizer = optimizer

    def __repr__(self):
        return "ParamAttr(name=%r, initializer=%r, optimizer=%r)" % (
            self.name, self.initializer, self.optimizer)

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
