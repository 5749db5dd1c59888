"""The transfer layer: every copy between stager and somewhere else.

``stager put``/``get``, ``Client.put``/``get``, the ``stager://`` filesystem's
``put``/``get`` and ``stager stage`` all go through here, so each behaves the
same whichever way it is called:

* :mod:`.sources`: what a copy in reads (a local tree, any fsspec filesystem);
* :mod:`.sinks`: what a copy out writes, appearing whole with the source's mtime;
* :mod:`.copy`: one file in (:func:`copy_in`) or out (:func:`copy_out`);
* :mod:`.small`: small files written in groups (:class:`SmallFiles`);
* :mod:`.local`: local trees in and out (:func:`put_local`, :func:`get_local`).
"""

from ...sources.source import Source, SourceFile
from .copy import PART, WINDOW, Buffers, buffers_for, copy_in, copy_out, run_pool
from .local import get_local, put_file, put_local
from .sinks import LocalSink, Sink, sink_for
from .small import SmallFiles

__all__ = ["PART", "WINDOW", "Buffers", "LocalSink", "Sink", "SmallFiles", "Source",
           "SourceFile", "buffers_for", "copy_in", "copy_out", "get_local", "put_file",
           "put_local", "run_pool", "sink_for"]
