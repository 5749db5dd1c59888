from stager import Client


def test_put_and_read_back(client: Client, ns: str, payload) -> None:
    data = payload(10 * 1024 * 1024 + 17)
    info = client.pipe(f"{ns}/a.bin", data)
    assert info.size == len(data)
    assert client.cat(f"{ns}/a.bin") == data
    assert client.cat(f"{ns}/a.bin", 5, 4 * 1024 * 1024 + 9) == data[5:4 * 1024 * 1024 + 9]
