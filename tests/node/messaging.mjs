// RocketMQ's messaging features with the official Node.js client: a delayed message (the
// client's `delay`) and two transactional messages, one committed and one rolled back, read by
// one SimpleConsumer. Prints one JSON line of what it saw, for
// tests/python/test_rocketmq_node.py to check; exits 1 on any error.
//
//   node messaging.mjs ENDPOINT DELAY_TOPIC TRANSACTION_TOPIC GROUP
import { Producer, SimpleConsumer } from 'rocketmq-client-nodejs';

const [endpoints, delayTopic, txTopic, group] = process.argv.slice(2);
const quiet = { info() {}, warn() {}, error: console.error, debug() {}, trace() {} };
// Each step is noted on stderr, so a run that hangs (the test's subprocess times out) says where.
const step = (what) => console.error(`${new Date().toISOString()} ${what}`);
// The check-back would commit what the test leaves open; it leaves nothing open.
const COMMIT = 1;
const checker = { async check() { return COMMIT; } };

const producer = new Producer({ endpoints, topics: [delayTopic, txTopic], checker, logger: quiet });
step('producer startup');
await producer.startup();
const delayMs = 3000;
const sentAt = Date.now();
step('send delayed');
const delayed = await producer.send({ topic: delayTopic, body: Buffer.from('node-delayed'), delay: delayMs });
const dueAt = sentAt + delayMs;

const committed = producer.beginTransaction();
step('send transactional (commit)');
const commitReceipt = await producer.send({ topic: txTopic, body: Buffer.from('node-committed') }, committed);
const rolledBack = producer.beginTransaction();
step('send transactional (rollback)');
const rollbackReceipt = await producer.send({ topic: txTopic, body: Buffer.from('node-rolled-back') }, rolledBack);
// Not visible before the commit.
await new Promise((resolve) => setTimeout(resolve, 500));

const consumer = new SimpleConsumer({
  endpoints,
  consumerGroup: group,
  subscriptions: new Map([[delayTopic, '*'], [txTopic, '*']]),
  awaitDuration: 1000,
  logger: quiet,
});
step('consumer startup');
await consumer.startup();
step('receive before commit');
const beforeCommit = await consumer.receive(16, 10000);
step('commit and rollback');
await committed.commit();
await rolledBack.rollback();

step('receive');
const received = [];
const deadline = Date.now() + 20000;
while (Date.now() < deadline && received.length < 2) {
  for (const message of await consumer.receive(16, 10000)) {
    received.push({
      body: message.body.toString(),
      messageId: message.messageId,
      at: Date.now(),
      deliveryTimestamp: message.deliveryTimestamp ? message.deliveryTimestamp.getTime() : null,
    });
    await consumer.ack(message);
  }
}
// Anything more (the rolled-back message) would come now.
step('receive what more comes');
const extraDeadline = Date.now() + 3000;
const extra = [];
while (Date.now() < extraDeadline) {
  for (const message of await consumer.receive(16, 10000)) {
    extra.push(message.body.toString());
    await consumer.ack(message);
  }
}
step('shutdown');
await consumer.shutdown();
await producer.shutdown();
console.log(JSON.stringify({
  sentAt,
  dueAt,
  delayedId: delayed.messageId,
  committedId: commitReceipt.messageId,
  rolledBackId: rollbackReceipt.messageId,
  beforeCommit: beforeCommit.map((m) => m.body.toString()),
  received,
  extra,
}));
process.exit(0);
