"""Shared fixtures: real RoCOCO annotation files, tiny random open_clip models, temp stores."""
from __future__ import annotations

import logging
import os
import signal
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("HARDRANK_SHARED", ROOT.parent / "shared"))
ROCOCO_DIR = SHARED / "data" / "rococo"

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    # A suite launched in the background by a script (`cmd &`, no job control) inherits SIGINT ignored: Python
    # then installs no KeyboardInterrupt handler, here or in the commands the tests start (an ignored signal
    # stays ignored across exec). The Ctrl-C tests need both; a Python handler here resets to default in children.
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def rococo_dir() -> Path:
    if not (ROCOCO_DIR / "coco_karpathy_test.json").is_file():
        pytest.skip(f"real RoCOCO files not found at {ROCOCO_DIR} (set HARDRANK_SHARED)")
    return ROCOCO_DIR


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    # never touch the user's ~/.cache from tests
    monkeypatch.setenv("HARDRANK_CACHE", str(tmp_path_factory.getbasetemp() / "hardrank-cache"))


def pytest_collection_modifyitems(config, items):
    # the long chaos loops (-m chaos) and the whole cross products of parametrized equality tests (-m matrix) run
    # only when asked for; the default suite runs their short version, or a subset covering every value
    asked = config.getoption("markexpr") or ""
    for mark, why in (("chaos", "long chaos loop: run with -m chaos"),
                      ("matrix", "outside the covering subset: run the whole product with -m matrix")):
        if mark in asked:
            continue
        for item in items:
            if mark in item.keywords:
                item.add_marker(pytest.mark.skip(reason=why))


# -- an S3-compatible server on 127.0.0.1 (moto's server mode), used through s3fs as any user would ----------
@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on 127.0.0.1 for one test module (its AWS_* variables set while the module runs),
    holding an empty bucket ``bucket``; yields an s3fs filesystem on it."""
    server_mod = pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # the server logs every request otherwise
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    # moto keeps its state per process, not per server: start each module from an empty S3
    urllib.request.urlopen(urllib.request.Request(f"http://{host}:{port}/moto-api/reset", method="POST")).close()
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    fs.mkdir("bucket")
    try:
        yield fs
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


@pytest.fixture(scope="module")
def one_faiss_thread():
    """FAISS on one thread for a module's tiny problems: on 2 shared cores its OpenMP threads' spin-waiting
    makes 2 threads up to 10x slower than 1 (``pytestmark = pytest.mark.usefixtures("one_faiss_thread")``)."""
    from hardrank.scoring import faiss_index

    n = faiss_index.faiss.omp_get_max_threads()
    faiss_index.faiss.omp_set_num_threads(1)
    yield
    faiss_index.faiss.omp_set_num_threads(n)
