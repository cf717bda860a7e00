"""CQL front end: parse statement text into the immutable AST in cql.ast."""

from . import ast as _ast
from .ast import *  # noqa: F401,F403 - the AST's names, as listed in cql.ast.__all__
from .binding import BindError, bind, bind_marker_count
from .parser import CqlSyntaxError, parse

__all__ = ["parse", "bind", "bind_marker_count", "BindError", "CqlSyntaxError", *_ast.__all__]
