import time

from stager import Client
from stager.protocol.manifest import Manifest, ManifestFile


def test_manifest(client: Client, ns: str) -> None:
    files = []
    for i in range(5):
        info = client.pipe(f"{ns}/ds/sub/f{i}", bytes([i]) * (i * 1000))
        files.append(ManifestFile(f"sub/f{i}", info.size, info.mtime, info.file_id))
    manifest = Manifest(f"{ns}/ds", tuple(files), source="test", created=time.time())
    assert client.put_manifest(manifest) == 5
    m = client.get_manifest(f"{ns}/ds")
    assert [f.path for f in m.files] == [f"sub/f{i}" for i in range(5)]
    assert not any(f.stale for f in m.files)
    assert m.files[3].layout is not None and len(m.files[3].checksums) == 1
    client.pipe(f"{ns}/ds/sub/f2", b"changed")
    m = client.get_manifest(f"{ns}/ds")
    assert m.files[2].stale and not m.files[1].stale
    assert client.get_manifest(f"{ns}/ds/sub") is None
    client.rename(f"{ns}/ds", f"{ns}/ds2")
    assert len(client.get_manifest(f"{ns}/ds2").files) == 5
    client.rm(f"{ns}/ds2", recursive=True)
    client.mkdir(f"{ns}/ds2")
    assert client.get_manifest(f"{ns}/ds2") is None
