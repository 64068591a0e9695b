import type { NodeConnectionOptions } from "@nats-io/transport-node";

/**
 * MAX_RECONNECT_ATTEMPTS_DEFAULT is the SDK's maxReconnectAttempts, -1: reconnect for ever.
 * nats.js gives up after 10 attempts 2 s apart, so a 20 s NATS outage would close the client
 * for good and strand every event still waiting for its verdict. The Go SDK's users pass
 * nats.MaxReconnects(-1) for the same reason (docs/sdk.md, "Connecting").
 */
export const MAX_RECONNECT_ATTEMPTS_DEFAULT = -1;

/**
 * natsOptions are the options of every connection the SDK opens: the user's, with
 * maxReconnectAttempts -1 unless they set it. Two of nats.js's defaults stay, as in nats.go:
 * - waitOnFirstConnect false: a first connect that fails rejects at once. With it true and
 *   endless attempts, a wrong address or credential would make connect() hang for ever.
 * - reconnectTimeWait 2 s (plus up to 100 ms of jitter): after a restart every worker's two
 *   connections dial again, spread out. The first attempt after a drop is immediate. A
 *   shorter wait reconnects sooner after a blip, at more dials: set it in opts.nats.
 */
export function natsOptions(servers: string | string[] | undefined, nats: Partial<NodeConnectionOptions> | undefined): Partial<NodeConnectionOptions> {
  return {
    servers: servers ?? "127.0.0.1:4222",
    ...nats,
    // Not a spread default: an explicit undefined would reach nats.js, which reads it as 0.
    maxReconnectAttempts: nats?.maxReconnectAttempts ?? MAX_RECONNECT_ATTEMPTS_DEFAULT,
  };
}
