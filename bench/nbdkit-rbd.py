# nbdkit's only route to Ceph, for bench/rbd.sh: its python plugin over python3-rbd.
# One cluster connection and one image per process, shared by every connection
# (as blkd's rbd plugin does), so writes on several connections do not bounce
# the image's exclusive lock.  Parameters: conf=FILE pool=POOL image=NAME.
import threading
import nbdkit
import rados
import rbd

API_VERSION = 2
params = {"pool": "rbd"}
lock = threading.Lock()
image = None


def config(key, value):
    params[key] = value


def thread_model():
    return nbdkit.THREAD_MODEL_PARALLEL


def open(readonly):
    global image
    with lock:
        if image is None:
            cluster = rados.Rados(conffile=params["conf"])
            cluster.connect()
            image = rbd.Image(cluster.open_ioctx(params["pool"]), params["image"])
    return 1


def get_size(h):
    return image.size()


def can_multi_conn(h):
    return True


def pread(h, buf, offset, flags):
    buf[:] = image.read(offset, len(buf))


def pwrite(h, buf, offset, flags):
    image.write(bytes(buf), offset)


def flush(h, flags):
    image.flush()
