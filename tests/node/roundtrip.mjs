// One round trip with the official RocketMQ 5 Node.js client: a Producer sends tagged messages
// with keys and properties, a SimpleConsumer receives those its tag expression selects and
// acks them, and a second receive after their invisible time finds nothing. Prints one JSON
// line of what it saw, for tests/python/test_rocketmq_node.py to check; exits 1 on any error.
//
//   node roundtrip.mjs ENDPOINT TOPIC GROUP
import { Producer, SimpleConsumer } from 'rocketmq-client-nodejs';

const [endpoints, topic, group] = process.argv.slice(2);
const quiet = { info() {}, warn() {}, error: console.error, debug() {}, trace() {} };

const producer = new Producer({ endpoints, topics: [topic], logger: quiet });
await producer.startup();
const sent = [];
for (const [i, tag] of ['TagA', 'TagB', 'TagA'].entries()) {
  const receipt = await producer.send({
    topic,
    tag,
    keys: [`key-${i}`],
    properties: new Map([['lang', 'узел.js']]),
    body: Buffer.from(`node-${i}`),
  });
  sent.push({ messageId: receipt.messageId, offset: Number(receipt.offset) });
}
await producer.shutdown();

const consumer = new SimpleConsumer({
  endpoints,
  consumerGroup: group,
  subscriptions: new Map([[topic, 'TagA']]),
  awaitDuration: 2000,
  logger: quiet,
});
await consumer.startup();
const received = [];
const deadline = Date.now() + 30000;
while (received.length < 2 && Date.now() < deadline) {
  for (const message of await consumer.receive(16, 2000)) {
    received.push({
      body: message.body.toString(),
      tag: message.tag,
      keys: message.keys,
      lang: message.properties.get('lang'),
      messageId: message.messageId,
      attempt: message.deliveryAttempt,
    });
    await consumer.ack(message);
  }
}
await new Promise((resolve) => setTimeout(resolve, 2500));
const after = await consumer.receive(16, 2000);
await consumer.shutdown();
console.log(JSON.stringify({ sent, received, after: after.length }));
process.exit(0);
