#!/usr/bin/python3
# needs: docker, python3:boto3, python3:botocore
"""Proof that scripts/aws-standin speaks the real AWS wire formats: drive it with botocore/boto3.

Needs the Debian packages python3-boto3 python3-botocore (this test installs nothing) and a dockerd with
the local image sbx-busybox:latest. Prints TAP; exits 1 on any failure.
"""

import datetime
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import standin_common  # noqa: E402
from standin_common import Tap, docker  # noqa: E402

try:
    import boto3
    import botocore
    import botocore.auth
    from botocore.config import Config
    from botocore.exceptions import ClientError
except ImportError:
    print("not ok 1 - boto3 missing (apt-get install python3-boto3)")
    print("1..1")
    sys.exit(1)

HERE = os.path.dirname(os.path.abspath(__file__))
STANDIN = os.path.join(HERE, "..", "scripts", "aws-standin")
AK, SK = "AKIDSTANDIN", "standin-secret"
REGION = "us-west-2"

T = Tap()
ok = T.ok
diag = T.diag



def err_code(fn):
    """Run fn, return (code, http status, message) of the ClientError, or (None, None, result)."""
    try:
        return None, None, fn()
    except ClientError as e:
        return (e.response["Error"].get("Code"), e.response["ResponseMetadata"].get("HTTPStatusCode"),
                e.response["Error"].get("Message"))


# ---------------- docker API (independent of the stand-in)
# ---------------- stand-in process
proc = None
url = None


def http_json(method, path, obj=None):
    return standin_common.http_json(url, method, path, obj)


def set_faults(**kw):
    return http_json("POST", "/_standin/faults", kw)


def state():
    return http_json("GET", "/_standin/state")


def calls(op):
    return state()["calls"].get(op, 0)


def client(svc, secret=SK, key=AK, token=None, region=REGION, retries=None):
    cfg = Config(retries=retries) if retries else None
    return boto3.client(svc, endpoint_url=url, region_name=region, aws_access_key_id=key,
                        aws_secret_access_key=secret, aws_session_token=token, config=cfg)


def main():
    global proc, url
    proc = subprocess.Popen([STANDIN, "--port", "0"], stdout=subprocess.PIPE, text=True)
    url = proc.stdout.readline().strip()
    ok(url.startswith("http://127.0.0.1:") and url.rsplit(":", 1)[1].isdigit(), f"stand-in prints its URL ({url!r})")
    if not url:
        return
    diag(f"boto3 {boto3.__version__} botocore {botocore.__version__}")

    ecs = client("ecs")
    iam = client("iam", region="us-east-1")

    # ---------------- ECS clusters
    r = ecs.describe_clusters(clusters=["sbx-test"])
    ok(r["clusters"] == [] and r["failures"][0]["reason"] == "MISSING"
       and r["failures"][0]["arn"].endswith(":cluster/sbx-test"), "DescribeClusters of unknown cluster: failures MISSING", r)
    r = ecs.create_cluster(clusterName="sbx-test", settings=[{"name": "containerInsights", "value": "disabled"}])
    carn = r["cluster"]["clusterArn"]
    ok(carn == f"arn:aws:ecs:{REGION}:000000000000:cluster/sbx-test", f"CreateCluster ARN {carn}")
    r = ecs.describe_clusters(clusters=["sbx-test"])
    ok(r["clusters"][0]["status"] == "ACTIVE" and not r["failures"], "DescribeClusters ACTIVE")
    code, status, msg = err_code(lambda: ecs.run_task(cluster="nope", taskDefinition="x"))
    ok(code == "ClusterNotFoundException" and status == 400, f"RunTask on unknown cluster -> {code} {status}")

    # ---------------- task definition
    r = ecs.register_task_definition(
        family="sbx-standin-test", networkMode="awsvpc", requiresCompatibilities=["FARGATE"], cpu="256", memory="512",
        containerDefinitions=[{"name": "sandbox", "image": "sbx-busybox:latest", "essential": True,
                               "command": ["sleep", "300"], "linuxParameters": {"initProcessEnabled": True}}])
    td = r["taskDefinition"]
    tdarn = td["taskDefinitionArn"]
    ok(tdarn.startswith(f"arn:aws:ecs:{REGION}:000000000000:task-definition/sbx-standin-test:") and td["revision"] >= 1,
       f"RegisterTaskDefinition {tdarn}")
    r2 = ecs.register_task_definition(
        family="sbx-standin-test", networkMode="awsvpc", requiresCompatibilities=["FARGATE"], cpu="256", memory="512",
        containerDefinitions=[{"name": "sandbox", "image": "sbx-busybox:latest", "command": ["sleep", "300"],
                               "linuxParameters": {"initProcessEnabled": True}}])
    ok(r2["taskDefinition"]["revision"] == td["revision"] + 1, "second registration gets the next revision")
    code, _, msg = err_code(lambda: ecs.register_task_definition(
        family="bad", networkMode="bridge", requiresCompatibilities=["FARGATE"], cpu="256", memory="512",
        containerDefinitions=[{"name": "a", "image": "x"}]))
    ok(code == "ClientException", f"Fargate with bridge networking -> {code}: {msg}")

    # ---------------- RunTask
    code, _, msg = err_code(lambda: ecs.run_task(cluster="sbx-test", taskDefinition=tdarn, launchType="FARGATE"))
    ok(code == "InvalidParameterException", f"RunTask awsvpc without networkConfiguration -> {code}")
    r = ecs.run_task(cluster="sbx-test", taskDefinition=tdarn, launchType="FARGATE", enableExecuteCommand=True,
                     networkConfiguration={"awsvpcConfiguration": {"subnets": ["subnet-123"],
                                                                   "securityGroups": ["sg-1"],
                                                                   "assignPublicIp": "ENABLED"}},
                     tags=[{"key": "sbx", "value": "standin-test"}])
    task = r["tasks"][0]
    tarn = task["taskArn"]
    ok(not r["failures"] and task["lastStatus"] == "PROVISIONING" and tarn.startswith(
        f"arn:aws:ecs:{REGION}:000000000000:task/sbx-test/"), f"RunTask -> PROVISIONING {tarn}")
    ok(isinstance(task["createdAt"], datetime.datetime), "createdAt parsed by botocore as a datetime")

    t = None
    deadline = time.time() + 30
    while time.time() < deadline:
        t = ecs.describe_tasks(cluster="sbx-test", tasks=[tarn])["tasks"][0]
        agents = t["containers"][0].get("managedAgents", [])
        if t["lastStatus"] == "RUNNING" and agents and agents[0]["lastStatus"] == "RUNNING":
            break
        if t["lastStatus"] == "STOPPED":
            break
        time.sleep(0.3)
    agents = t["containers"][0].get("managedAgents", [])
    ok(t["lastStatus"] == "RUNNING" and agents[0]["name"] == "ExecuteCommandAgent" and agents[0]["lastStatus"] == "RUNNING",
       "DescribeTasks reaches RUNNING with ExecuteCommandAgent RUNNING", t)
    ok({"key": "sbx", "value": "standin-test"} in t.get("tags", []), "RunTask tags returned by DescribeTasks", t.get("tags"))
    rid = t["containers"][0].get("runtimeId", "")
    status, info = docker("GET", f"/containers/{rid}/json") if rid else (0, None)
    ok(status == 200 and info["State"]["Running"] and info["Config"]["Cmd"] == ["sleep", "300"]
       and info["Config"]["Image"] == "sbx-busybox:latest" and info["HostConfig"]["Init"] is True
       and info["Config"]["Labels"].get("sbx.standin") == "1" and info["Config"]["Labels"].get("sbx.standin.task") == tarn,
       "real Docker container runs with image, command, Init, labels", (status, info and info.get("State")))

    ecs.tag_resource(resourceArn=tarn, tags=[{"key": "extra", "value": "1"}])
    tags = ecs.list_tags_for_resource(resourceArn=tarn)["tags"]
    ok({"key": "extra", "value": "1"} in tags and {"key": "sbx", "value": "standin-test"} in tags, "TagResource + ListTagsForResource")
    ok(tarn in ecs.list_tasks(cluster="sbx-test")["taskArns"], "ListTasks lists the task")

    # ---------------- ExecuteCommand
    r = ecs.execute_command(cluster="sbx-test", task=tarn, container="sandbox", interactive=True,
                            command="/bin/sh -c 'echo hi'")
    s = r["session"]
    ok(s["streamUrl"] == f"ws://127.0.0.1:{url.rsplit(':', 1)[1]}/ssm/{s['sessionId']}" and s["tokenValue"]
       and r["taskArn"] == tarn and r["containerName"] == "sandbox", f"ExecuteCommand session {s['streamUrl']}")
    sess = [x for x in state()["sessions"] if x["sessionId"] == s["sessionId"]]
    ok(sess and sess[0]["command"] == "/bin/sh -c 'echo hi'" and sess[0]["containerId"] == rid,
       "session keeps container and command in state")
    code, _, msg = err_code(lambda: ecs.execute_command(cluster="sbx-test", task=tarn, interactive=False, command="ls"))
    ok(code == "InvalidParameterException", f"ExecuteCommand interactive=false -> {code}: {msg}")

    # ---------------- agent_never_connects
    set_faults(agent_never_connects=True)
    t2 = ecs.run_task(cluster="sbx-test", taskDefinition=tdarn, launchType="FARGATE", enableExecuteCommand=True,
                      networkConfiguration={"awsvpcConfiguration": {"subnets": ["subnet-123"]}})["tasks"][0]["taskArn"]
    deadline = time.time() + 30
    while time.time() < deadline:
        tt = ecs.describe_tasks(cluster="sbx-test", tasks=[t2])["tasks"][0]
        if tt["lastStatus"] == "RUNNING":
            break
        time.sleep(0.3)
    ok(tt["lastStatus"] == "RUNNING" and tt["containers"][0]["managedAgents"][0]["lastStatus"] == "PENDING",
       "agent_never_connects: task RUNNING, agent PENDING")
    code, _, _ = err_code(lambda: ecs.execute_command(cluster="sbx-test", task=t2, interactive=True, command="ls"))
    ok(code == "TargetNotConnectedException", f"ExecuteCommand with agent PENDING -> {code}")
    set_faults(agent_never_connects=False)
    # t2 stays running on purpose: the SIGTERM cleanup check at the end must remove it.
    t2_rid = tt["containers"][0]["runtimeId"]

    # ---------------- StopTask
    r = ecs.stop_task(cluster="sbx-test", task=tarn, reason="test done")
    ok(r["task"]["lastStatus"] == "STOPPED" and r["task"]["stoppedReason"] == "test done", "StopTask -> STOPPED with reason")
    status, _ = docker("GET", f"/containers/{rid}/json")
    ok(status == 404, f"container is gone after StopTask (docker inspect -> {status})")
    t = ecs.describe_tasks(cluster="sbx-test", tasks=[tarn])["tasks"][0]
    ok(t["lastStatus"] == "STOPPED" and t["desiredStatus"] == "STOPPED", "DescribeTasks after StopTask: STOPPED")
    r = ecs.describe_tasks(cluster="sbx-test", tasks=["0123456789abcdef0123456789abcdef"])
    ok(r["failures"] and r["failures"][0]["reason"] == "MISSING", "DescribeTasks unknown task -> failures MISSING")

    r = ecs.deregister_task_definition(taskDefinition=tdarn)
    ok(r["taskDefinition"]["status"] == "INACTIVE", "DeregisterTaskDefinition -> INACTIVE")
    code, _, msg = err_code(lambda: ecs.run_task(cluster="sbx-test", taskDefinition=tdarn, launchType="FARGATE",
                                                 networkConfiguration={"awsvpcConfiguration": {"subnets": ["s"]}}))
    ok(code == "ClientException", f"RunTask with INACTIVE task definition -> {code}: {msg}")

    # ---------------- IAM
    trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"Service": "ecs-tasks.amazonaws.com"},
                                                     "Action": "sts:AssumeRole"}]}
    r = iam.create_role(RoleName="sbx-standin-role", AssumeRolePolicyDocument=json.dumps(trust), Description="d & <x>")
    ok(r["Role"]["Arn"] == "arn:aws:iam::000000000000:role/sbx-standin-role", f"CreateRole {r['Role']['Arn']}")
    r = iam.get_role(RoleName="sbx-standin-role")["Role"]
    ok(r["AssumeRolePolicyDocument"] == trust and isinstance(r["CreateDate"], datetime.datetime)
       and r["RoleId"].startswith("AROA") and r["Description"] == "d & <x>",
       "GetRole: botocore URL-decodes the AssumeRolePolicyDocument back to the same dict", r)
    code, status, _ = err_code(lambda: iam.create_role(RoleName="sbx-standin-role", AssumeRolePolicyDocument=json.dumps(trust)))
    ok(code == "EntityAlreadyExists" and status == 409, f"CreateRole twice -> {code} {status}")
    exec_pol = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Resource": "*", "Action": [
        "ssmmessages:CreateControlChannel", "ssmmessages:CreateDataChannel",
        "ssmmessages:OpenControlChannel", "ssmmessages:OpenDataChannel"]}]}
    r = iam.put_role_policy(RoleName="sbx-standin-role", PolicyName="exec", PolicyDocument=json.dumps(exec_pol))
    ok(r["ResponseMetadata"]["HTTPStatusCode"] == 200, "PutRolePolicy")
    r = iam.attach_role_policy(RoleName="sbx-standin-role",
                               PolicyArn="arn:aws:iam::aws:policy/service-role/AmazonECSTaskExecutionRolePolicy")
    ok(r["ResponseMetadata"]["HTTPStatusCode"] == 200, "AttachRolePolicy")
    code, status, msg = err_code(lambda: iam.get_role(RoleName="no-such-role"))
    ok(code == "NoSuchEntity" and status == 404, f"GetRole unknown -> {code} {status}: {msg}")
    code, status, _ = err_code(lambda: iam.put_role_policy(RoleName="no-such-role", PolicyName="p", PolicyDocument="{}"))
    ok(code == "NoSuchEntity", f"PutRolePolicy on unknown role -> {code}")
    code, status, _ = err_code(lambda: iam.delete_role(RoleName="sbx-standin-role"))
    ok(code == "DeleteConflict" and status == 409, f"DeleteRole with policies -> {code} {status}")

    # IAM must be signed for us-east-1. What does botocore do with endpoint_url and another region?
    iam_w2 = client("iam", region=REGION)
    code, status, msg = err_code(lambda: iam_w2.get_role(RoleName="sbx-standin-role"))
    diag(f"IAM client with region {REGION} + endpoint_url -> {code} {status}: {msg}")
    ok(code == "SignatureDoesNotMatch" and "valid region" in (msg or ""),
       "IAM client in us-west-2 with endpoint_url signs with us-west-2 (rejected: IAM wants us-east-1)")

    # ---------------- auth failures
    bad = client("ecs", secret="wrong-secret")
    code, status, _ = err_code(lambda: bad.describe_clusters(clusters=["sbx-test"]))
    ok(code == "SignatureDoesNotMatch" and status == 403, f"ECS with wrong secret -> {code} {status}")
    bad = client("iam", secret="wrong-secret", region="us-east-1")
    code, status, _ = err_code(lambda: bad.get_role(RoleName="sbx-standin-role"))
    ok(code == "SignatureDoesNotMatch" and status == 403, f"IAM with wrong secret -> {code} {status}")
    code, _, _ = err_code(lambda: client("ecs", key="AKIDUNKNOWN").describe_clusters())
    ok(code == "UnrecognizedClientException", f"ECS with unknown key -> {code}")
    code, _, _ = err_code(lambda: client("iam", key="AKIDUNKNOWN", region="us-east-1").get_role(RoleName="x"))
    ok(code == "InvalidClientTokenId", f"IAM with unknown key -> {code}")
    code, _, _ = err_code(lambda: client("ecs", token="some-token").describe_clusters())
    ok(code == "UnrecognizedClientException", f"ECS with unexpected session token -> {code}")

    # clock skew: make botocore's signer believe it is 10 minutes ago
    real_dt = botocore.auth.datetime

    class _ShiftedDatetime(datetime.datetime):
        @classmethod
        def utcnow(cls):
            return real_dt.datetime.utcnow() - real_dt.timedelta(minutes=10)

    class _Shift:
        datetime = _ShiftedDatetime
        timedelta = real_dt.timedelta

    botocore.auth.datetime = _Shift
    try:
        c1 = calls("ecs.DescribeClusters")
        code, status, msg = err_code(lambda: client("ecs").describe_clusters())
        attempts = calls("ecs.DescribeClusters") - c1
        ok(code == "InvalidSignatureException", f"ECS with clock 10 min behind -> {code} {status} after {attempts} attempt(s)")
        code, status, _ = err_code(lambda: client("iam", region="us-east-1").get_role(RoleName="x"))
        ok(code == "RequestExpired", f"IAM with clock 10 min behind -> {code} {status}")
    finally:
        botocore.auth.datetime = real_dt

    # ---------------- faults
    set_faults(throttle=5)
    c1 = calls("ecs.DescribeClusters")
    code, status, _ = err_code(lambda: client("ecs", retries={"max_attempts": 1}).describe_clusters(clusters=["sbx-test"]))
    attempts = calls("ecs.DescribeClusters") - c1
    ok(code == "ThrottlingException" and status == 400, f"retries max_attempts=1 sees {code} {status}")
    diag(f"retries={{'max_attempts': 1}} made {attempts} HTTP attempts (botocore: max_attempts counts RETRIES)")
    ok(attempts == 2, f"botocore 'max_attempts': 1 means 1 retry = 2 attempts (saw {attempts})")
    set_faults(throttle=2)
    c1 = calls("ecs.DescribeClusters")
    code, _, r = err_code(lambda: client("ecs", retries={"mode": "standard", "total_max_attempts": 3}).describe_clusters(
        clusters=["sbx-test"]))
    attempts = calls("ecs.DescribeClusters") - c1
    ok(code is None and r["clusters"][0]["clusterName"] == "sbx-test" and attempts == 3,
       f"standard retries (3 attempts) survive throttle=2 ({attempts} attempts)", (code, r))
    set_faults(throttle=0, error5xx=1)
    code, status, _ = err_code(lambda: client("ecs", retries={"total_max_attempts": 1}).describe_clusters())
    ok(code == "ServerException" and status == 500, f"error5xx on ECS -> {code} {status}")
    set_faults(error5xx=1)
    code, status, _ = err_code(lambda: client("iam", region="us-east-1", retries={"total_max_attempts": 1}).get_role(
        RoleName="sbx-standin-role"))
    ok(code == "ServiceFailure" and status == 500, f"error5xx on IAM -> {code} {status}")
    set_faults(error5xx=1)
    code, _, r = err_code(lambda: client("iam", region="us-east-1", retries={"mode": "standard"}).get_role(
        RoleName="sbx-standin-role"))
    ok(code is None, "standard retries survive one IAM 500")

    # ---------------- SIGTERM cleanup
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=30)
    status, _ = docker("GET", f"/containers/{t2_rid}/json")
    ok(rc == 0 and status == 404, f"SIGTERM: stand-in exits ({rc}) and removes its running container (inspect -> {status})")
    proc = None


standin_common.run(T, main, lambda: [proc])
