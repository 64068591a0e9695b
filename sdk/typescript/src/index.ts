// @flowness/ledger: the TypeScript SDK of the ledger. It speaks the public
// wire contract (docs/contract.md) with the same semantics as the Go SDK
// (pkg/worker): a lease kept alive with a local deadline, versions assigned
// per task from task.head, pipelined publishes, receipts with a verdict
// lookup when one is lost, and a reader that never creates a consumer.
export { connect, Client, type ConnectOptions, type Config, type CallOptions, type Logger } from "./client.js";
export {
  TTL_MS_DEFAULT,
  REQUEST_TIMEOUT_MS_DEFAULT,
  MAX_IN_FLIGHT_DEFAULT,
  PUBLISH_ACK_TIMEOUT_MS_DEFAULT,
  RECEIPT_TIMEOUT_MS_DEFAULT,
  BATCH_MAX_DEFAULT,
  BATCH_LINGER_MS_DEFAULT,
  BATCH_MAX_BYTES_DEFAULT,
} from "./client.js";
export { Lease, Pending, safetyMarginMs, type PubAck, type PublishOptions } from "./lease.js";
export { MAX_RECONNECT_ATTEMPTS_DEFAULT } from "./nats.js";
export { Reader, connectReader, type ReaderOptions, type WatchOptions } from "./reader.js";
export { LedgerError, ServiceError, RejectedError, type ErrorCode } from "./errors.js";
export { contentToken, ulid, ulidTime, validEventId } from "./ulid.js";
export {
  partitionOf,
  validHolder,
  validTask,
  validType,
  inboxPrefix,
  Subjects,
  PREFIX_DEFAULT,
  BUCKET_TASKS,
  TTL_MIN_MS,
  TTL_MAX_MS,
  MAX_PAYLOAD_DEFAULT,
  MAX_BATCH,
  batchBody,
  batchMessage,
  type BatchEvent,
  type BatchMessage,
  type Receipt,
  type Verdict,
  type TaskHead,
  type EventVerdict,
  type LeaseReply,
  type ErrorReply,
  type OperatorAction,
  type Projection,
} from "./wire.js";
