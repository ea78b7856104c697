"""Running a check as every rank of a group whose ranks are threads of this process."""

import threading

import xccl


def in_threads(n, fn):
    """Runs ``fn(comm)`` for each of the ``n`` ranks of ``xccl.Communicator.local(n)``, one
    thread each; 1 if any rank raised (its traceback is printed), else 0: an exit status."""
    comms = xccl.Communicator.local(n)
    failed = []

    def rank(c):
        try:
            fn(c)
        except BaseException:
            failed.append(c.rank)
            raise

    threads = [threading.Thread(target=rank, args=(c,)) for c in comms]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return 1 if failed else 0
