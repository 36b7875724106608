"""The controller's wait on a group of tasks: a failed rank is an error at once, not when the
peers it left inside a collective time out; a call that runs long is named while it runs and
stops the run at its deadline."""

import time

import pytest

pytestmark = pytest.mark.integration


def test_the_first_failure_raises_at_once_and_a_preferred_error_wins(ray_session):
    import ray

    from rlpost.controller.cluster import get_all

    @ray.remote(num_cpus=0)
    def fails(message, after_s=0.0):
        time.sleep(after_s)
        raise RuntimeError(message)

    @ray.remote(num_cpus=0)
    def waits(seconds):
        time.sleep(seconds)
        return seconds

    assert get_all([waits.remote(0.1), waits.remote(0.2)], first=[]) == [0.1, 0.2]

    # a sender fails; its receiver waits for data that never comes (here: 60 s)
    start = time.time()
    with pytest.raises(ray.exceptions.RayTaskError, match="sender broke"):
        get_all([waits.remote(60), fails.remote("sender broke")], grace_s=1.0)
    assert time.time() - start < 30

    receiver = waits.remote(60)
    start = time.time()
    with pytest.raises(ray.exceptions.RayTaskError, match="sender broke"):
        get_all([receiver, fails.remote("sender broke")], first=[receiver], grace_s=1.0)
    assert time.time() - start < 30  # the receiver had its grace, then the sender's error

    # a receiver fails while another still waits: its error at once, no grace spent
    start = time.time()
    with pytest.raises(ray.exceptions.RayTaskError, match="tensor 'v' differs"):
        receivers = [fails.remote("tensor 'v' differs"), waits.remote(60)]
        get_all(receivers + [waits.remote(60)], first=receivers, grace_s=20.0)
    assert time.time() - start < 10

    # both fail, the sender first: the receiver's error, which names the tensor, is raised
    receiver = fails.remote("tensor 'w' differs", after_s=0.5)
    with pytest.raises(ray.exceptions.RayTaskError, match="tensor 'w' differs"):
        get_all([receiver, fails.remote("a receiver refused")], first=[receiver], grace_s=20.0)


def test_a_stall_is_named_while_it_lasts_and_stops_the_wait_at_its_deadline(ray_session):
    import ray

    from rlpost.controller.cluster import Deadlines, Stall, get_all

    @ray.remote(num_cpus=0)
    def waits(seconds):
        time.sleep(seconds)
        return seconds

    refs = [waits.remote(0.1), waits.remote(60)]
    labels = {refs[0]: "rollout rank 0: generate", refs[1]: "trainer rank 1: update"}
    ray.get(refs[0])  # (a loaded machine started its worker past the first second: it was named then)
    said = []
    start = time.time()
    with pytest.raises(Stall, match=r"waited 3 s for trainer rank 1: update \(cluster.stall_timeout_s=3\)"):
        get_all(refs, labels=labels, deadlines=Deadlines(warn_s=1.0, timeout_s=3.0, log=said.append))
    assert 2.9 < time.time() - start < 15
    # every second, what it still waits on: the rank that finished is not named
    assert len(said) >= 2 and all(s.startswith("still waiting after ") for s in said)
    assert all(s.endswith(" s for trainer rank 1: update") for s in said)
    said.clear()
    assert get_all([waits.remote(0.5)], deadlines=Deadlines(warn_s=0.2, timeout_s=30, log=said.append)) == [0.5]
    assert said and said[0] == "still waiting after 0 s for a task"  # a ref without a label


def test_a_wait_looks_each_second_at_what_may_stop_it(ray_session):
    """The start's waits (a signal while the workers start: the tenth catalogue's t57) stop at the
    first look after the signal, not when the call returns."""
    import ray

    from rlpost.controller.cluster import Deadlines, get_all
    from rlpost.controller.signals import Stopped

    @ray.remote(num_cpus=0)
    def waits(seconds):
        time.sleep(seconds)
        return seconds

    looks = []

    def poll():
        looks.append(time.monotonic())
        if len(looks) == 2:
            raise Stopped(15)

    start = time.monotonic()
    with pytest.raises(Stopped):
        get_all([waits.remote(60)], deadlines=Deadlines(warn_s=100.0, timeout_s=600, poll=poll))
    assert len(looks) == 2 and time.monotonic() - start < 10
    said = []
    assert get_all([waits.remote(1.5)], deadlines=Deadlines(warn_s=100.0, poll=lambda: None, log=said.append)) == [1.5]
    assert said == []  # a look is not a warning


def test_the_errors_of_peers_that_fail_with_the_first_are_fetched_not_left_unhandled(ray_session, monkeypatch):
    """The twelfth catalogue's recheck of t73: both trainer ranks failed on a full disk; the first
    rank's error was said in one line, and Ray then printed the second's, never fetched, as a
    67-line "Unhandled error" traceback."""
    import gc

    import ray
    from ray._private import worker

    from rlpost.controller.cluster import get_all

    unhandled = []
    monkeypatch.setattr(worker, "_unhandled_error_handler", unhandled.append)  # what Ray prints them with

    @ray.remote(num_cpus=0)
    def fails(message, after_s=0.0):
        time.sleep(after_s)
        raise OSError(message)

    refs = [fails.remote("No space left on device (rank 0)"), fails.remote("No space left on device (rank 1)", 0.3)]
    with pytest.raises(ray.exceptions.RayTaskError, match=r"\(rank 0\)"):
        get_all(refs, grace_s=1.0)
    del refs
    gc.collect()
    time.sleep(3.0)  # (Ray says an unfetched error some time after its reference goes)
    assert unhandled == []
