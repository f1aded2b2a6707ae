"""A three-server NATS cluster on loopback: Nodus's streams and buckets at R3 keep every acknowledged
write and keep taking writes when one server dies, and a client of the dead server carries on through
another (issue #9)."""

from __future__ import annotations

import nats.errors
import nats.js.errors
import pytest

from nodus_kit import declaring
from nodus_kit.connecting import connect
from nodus_kit.errors import AlreadyExists
from nodus_kit.storing import ObjectStore
from nodus_schema.jobs import Job, JobSpec
from nodus_schema.meta import ObjectMeta
from nodus_testing.natscluster import NatsCluster
from nodus_testing.waiting import eventually

pytestmark = pytest.mark.timeout(120)


def _job(name: str) -> Job:
    return Job(metadata=ObjectMeta(name=name, namespace="c"), spec=JobSpec(image="busybox"))


async def test_r3_buckets_keep_every_write_and_take_more_when_a_server_dies() -> None:
    with NatsCluster(3) as cluster:
        # The server the client is connected to dies, which forces a move to another member.
        nc = await connect(",".join(cluster.urls), "cluster-test")
        try:
            js = nc.jetstream()
            await declaring.ensure(js, replicas=3)
            info = await js.stream_info("KV_jobs")
            assert info.config.num_replicas == 3
            assert info.cluster is not None and len(info.cluster.replicas or []) == 2, "two followers"
            jobs = ObjectStore(nc, "jobs", Job)
            for i in range(20):
                await jobs.create(_job(f"before-{i}"))

            victim = next(m for m in cluster.members if nc.connected_url and m.port == nc.connected_url.port)
            cluster.kill(victim)

            async def written_after_the_kill() -> bool:
                try:
                    await jobs.create(_job("after-0"))
                except AlreadyExists:
                    pass  # an earlier try was stored before its answer was lost
                except (nats.errors.Error, nats.js.errors.Error) as e:  # reconnecting, or a new leader
                    raise AssertionError(f"not yet: {e!r}") from e
                return True

            await eventually(
                written_after_the_kill, deadline_s=30, message="no write accepted after a server died"
            )
            for i in range(1, 20):
                await jobs.create(_job(f"after-{i}"))

            async def listed() -> set[str | None]:
                try:
                    return {j.metadata.name for j in (await jobs.list("c")).items}
                except (nats.errors.Error, nats.js.errors.Error) as e:  # a consumer's leader still moving
                    raise AssertionError(f"not yet: {e!r}") from e

            names = await eventually(listed, deadline_s=30, message="the bucket could not be listed")
            assert names == {f"before-{i}" for i in range(20)} | {f"after-{i}" for i in range(20)}
            assert nc.connected_url is not None and nc.connected_url.port != victim.port

            # The dead server comes back and catches up: it serves the same objects.
            cluster.restart(victim)
            back = await connect(victim.url, "cluster-test-back")
            try:
                direct = ObjectStore(back, "jobs", Job)

                async def caught_up() -> bool:
                    try:
                        return len((await direct.list("c")).items) == 40
                    except (nats.errors.Error, nats.js.errors.Error) as e:
                        raise AssertionError(f"not yet: {e!r}") from e

                await eventually(caught_up, deadline_s=30, message="the restarted server never caught up")
            finally:
                await back.close()
        finally:
            await nc.close()


def test_replicas_follow_the_setting_else_the_cluster() -> None:
    three = {"cluster": "nodus", "connect_urls": ["a:4222", "b:4222", "c:4222"]}
    assert declaring.replicas_for(three, None) == 3
    assert declaring.replicas_for(three, 1) == 1, "the setting wins"
    assert declaring.replicas_for({"cluster": "nodus", "connect_urls": ["a:4222", "b:4222"]}, None) == 1
    assert declaring.replicas_for({"connect_urls": []}, None) == 1, "a lone server"


async def test_a_count_read_during_an_outage_never_lowers_r3_streams() -> None:
    with NatsCluster(3) as cluster:
        nc = await connect(cluster.url, "cluster-replicas")
        try:
            js = nc.jetstream()
            assert declaring.replicas_for(nc._server_info, None) == 3
            await declaring.ensure(js, replicas=3)
            # A service restarted while a member is down may count two servers: it keeps R3.
            await declaring.ensure(js, replicas=1, lower=False)
            assert (await js.stream_info("KV_jobs")).config.num_replicas == 3
            # An operator's explicit setting does lower them.
            await declaring.ensure(js, replicas=1)
            assert (await js.stream_info("KV_jobs")).config.num_replicas == 1
        finally:
            await nc.close()
