"""Celery's canvas (``celery.canvas``): signatures, and the primitives composed of them.

``Signature`` (``canvas.signatures``) is one task call kept as data; ``chain``, ``group``
and ``chord`` (``canvas.primitives``), ``chunks``, ``xmap`` and ``xstarmap``
(``canvas.maps``) compose them as Celery does. Sending a canvas inserts all its task calls
at once, as one akadze_core workflow: the database releases each step when the jobs it
waits on succeed, in the transaction that writes their outcome (``app.flow``).
"""

from ..utils.unsupported import not_provided
from .maps import chunks, xmap, xstarmap
from .primitives import chain, chain_class, chord, group
from .signatures import Signature, maybe_signature, reprcall, signature, subtask

# _chain too, as celery.canvas has it: the class | and chain(...) build (code written for
# Celery builds it directly, Celery's own tests among them).
_chain = chain_class
__all__ = ["Signature", "_chain", "chain", "chord", "chunks", "group", "maybe_signature",
           "reprcall", "signature", "subtask", "xmap", "xstarmap"]

#: Stamping walks a canvas in the client and has each worker keep the stamps it saw, to
#: revoke by header; here a sent canvas is jobs in the database and a revoke a row update.
STAMPING = ("stamping is not provided: tag tasks with headers= and revoke them by id",
            "stamping")
__getattr__ = not_provided(__name__, {"StampingVisitor": STAMPING})
