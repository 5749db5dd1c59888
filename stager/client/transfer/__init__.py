"""The transfer layer: every copy between stager and somewhere else.

``stager put``/``get``, ``Client.put``/``get``, the ``stager://`` filesystem's
``put``/``get`` and ``stager stage`` all go through here, so each behaves the
same whichever way it is called:

* :mod:`.sources`: what a copy in reads (local files here; any fsspec URL in
  :mod:`stager.stage.source`, with the same face);
* :mod:`.sinks`: what a copy out writes, appearing whole with the source's mtime;
* :mod:`.copy`: one file in (:func:`copy_in`) or out (:func:`copy_out`);
* :mod:`.small`: small files written in groups (:class:`SmallFiles`);
* :mod:`.local`: local trees in and out (:func:`put_local`, :func:`get_local`).
"""

from .copy import PART, WINDOW, Buffers, buffers_for, copy_in, copy_out, run_pool
from .local import get_local, put_file, put_local
from .sinks import TMP_TAG, FsspecSink, LocalSink, Sink, sink_for
from .small import SmallFiles
from .sources import LocalSource, Source, SourceFile, local_file

__all__ = ["PART", "TMP_TAG", "WINDOW", "Buffers", "FsspecSink", "LocalSink", "LocalSource",
           "Sink", "SmallFiles", "Source", "SourceFile", "buffers_for", "copy_in", "copy_out",
           "get_local", "local_file", "put_file", "put_local", "run_pool", "sink_for"]
