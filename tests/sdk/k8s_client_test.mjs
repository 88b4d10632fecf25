// needs: docker, python3, node
// The official Kubernetes JavaScript client (@kubernetes/client-node) drives
// the stand-in (scripts/k8s-standin): create a pod, watch it to Running,
// exec with stdin and an exit code (websocket, v5 or v4 channels), list by
// label, delete. TAP on stdout; run by tests/kubernetes_node_client_test.lua.
//   node k8s_client_test.mjs KUBECONFIG IMAGE [SBX_POD]
import * as k8s from '@kubernetes/client-node';
import { PassThrough, Readable } from 'node:stream';

const [kubeconfig, image, sbxPod] = process.argv.slice(2);
let n = 0, failed = 0;
const ok = (cond, name, extra) => {
  n++;
  if (!cond) failed++;
  console.log(`${cond ? 'ok' : 'not ok'} ${n} - ${name}${!cond && extra !== undefined ? `\n#   ${String(extra).replace(/\n/g, '\n#   ')}` : ''}`);
};

const kc = new k8s.KubeConfig();
kc.loadFromFile(kubeconfig);
const core = kc.makeApiClient(k8s.CoreV1Api);
const ns = 'default';
const name = `node-client-${process.pid}`;

function collect() {
  const s = new PassThrough();
  let text = '';
  s.on('data', (d) => { text += d.toString(); });
  return { s, text: () => text };
}

async function execIn(pod, container, argv, input) {
  const out = collect(), err = collect();
  const stdin = input === undefined ? null : Readable.from([Buffer.from(input)]);
  let status;
  const done = new Promise((resolve) => {
    new k8s.Exec(kc).exec(ns, pod, container, argv, out.s, err.s, stdin, false, (st) => { status = st; resolve(); })
      .then((ws) => ws.on('close', () => setTimeout(resolve, 100)), (e) => { status = { error: String(e) }; resolve(); });
  });
  await done;
  return { stdout: out.text(), stderr: err.text(), status };
}

try {
  const created = await core.createNamespacedPod({ namespace: ns, body: {
    metadata: { name, labels: { app: 'node-client' } },
    spec: { restartPolicy: 'Never', terminationGracePeriodSeconds: 0,
      containers: [{ name: 'main', image, command: ['sleep', '300'] }] },
  } });
  ok(created.metadata.name === name && created.status.phase === 'Pending', 'createNamespacedPod returns the pod, Pending');

  const watch = new k8s.Watch(kc);
  const events = [];
  const running = await new Promise((resolve) => {
    const timer = setTimeout(() => resolve(false), 60000);
    watch.watch(`/api/v1/namespaces/${ns}/pods`, { fieldSelector: `metadata.name=${name}` }, (type, obj) => {
      events.push(type);
      if (obj.status && obj.status.phase === 'Running') { clearTimeout(timer); resolve(true); }
    }, () => {}).then((req) => { setTimeout(() => req.abort(), 60000); });
  });
  ok(running, 'Watch sees the pod reach Running', events.join(','));
  ok(events[0] === 'ADDED' && events.includes('MODIFIED'), 'the watch starts with ADDED, then MODIFIED events', events.join(','));

  let r = await execIn(name, 'main', ['sh', '-c', 'echo out; echo err >&2; exit 3']);
  ok(r.stdout === 'out\n', 'exec: stdout on its channel', JSON.stringify(r));
  ok(r.stderr === 'err\n', 'exec: stderr on its own channel', JSON.stringify(r));
  ok(r.status && r.status.status === 'Failure' && r.status.reason === 'NonZeroExitCode'
    && r.status.details.causes.some((c) => c.reason === 'ExitCode' && c.message === '3'),
    'exec: the channel-3 Status carries exit code 3', JSON.stringify(r.status));
  r = await execIn(name, 'main', ['wc', '-c'], 'twelve bytes');
  ok(r.stdout.trim() === '12', 'exec: stdin reaches the command and ends (wc counts 12 bytes)', JSON.stringify(r));
  ok(r.status && r.status.status === 'Success', 'exec: Success for exit 0', JSON.stringify(r.status));

  const list = await core.listNamespacedPod({ namespace: ns, labelSelector: 'app=node-client' });
  ok(list.items.length === 1 && list.items[0].metadata.name === name, 'listNamespacedPod with a label selector');
  if (sbxPod) {
    const boxes = await core.listNamespacedPod({ namespace: ns, labelSelector: 'sbx=1' });
    const box = boxes.items.find((p) => p.metadata.name === sbxPod);
    ok(box && box.spec.automountServiceAccountToken === false && box.spec.restartPolicy === 'Never',
      'an sbx box is a pod the client reads: no service account token, restartPolicy Never');
    r = await execIn(sbxPod, 'box', ['cat', '/proc/1/cmdline']);
    ok(r.stdout.startsWith('sleep'), "exec into the sbx box: its PID 1 is the box's sleep", JSON.stringify(r));
  }

  await core.deleteNamespacedPod({ name, namespace: ns, gracePeriodSeconds: 0 });
  let gone = false;
  try { await core.readNamespacedPod({ name, namespace: ns }); } catch (e) {
    gone = (e.code === 404) || String(e).includes('404');
  }
  ok(gone, 'deleteNamespacedPod with gracePeriodSeconds 0: the pod is gone (404)');
  try { await core.readNamespacedPod({ name: 'no-such-pod', namespace: ns }); ok(false, 'a missing pod fails'); } catch (e) {
    const body = typeof e.body === 'string' ? JSON.parse(e.body) : e.body;
    ok(e.code === 404 && body && body.kind === 'Status' && body.reason === 'NotFound',
      'a missing pod: 404 with a Status, reason NotFound', String(e).slice(0, 300));
  }
} catch (e) {
  ok(false, 'no exception', e && e.stack || e);
}
console.log(`1..${n}`);
process.exit(failed ? 1 : 0);
