// A TCP proxy between a client and the ledger's NATS server, as
// internal/faultproxy is for the Go tests: cut() drops every connection
// through it and refuses new ones, as a network cut or a server restart
// does, until restore().
import net from "node:net";

export interface FaultProxy {
  /** url is the proxy's NATS URL, for the client's servers. */
  url: string;
  /** dropped counts the connections cut() dropped: proof that a cut reached the client. */
  readonly dropped: number;
  /** refused counts the connections refused while cut: each is one reconnect attempt of a client. */
  readonly refused: number;
  cut(): void;
  restore(): void;
  close(): Promise<void>;
}

export async function startProxy(target: string): Promise<FaultProxy> {
  const to = new URL(target.includes("://") ? target : `nats://${target}`);
  const pairs = new Set<[net.Socket, net.Socket]>();
  let isCut = false;
  let dropped = 0;
  let refused = 0;
  const server = net.createServer((down) => {
    down.on("error", () => {});
    if (isCut) {
      refused++;
      return void down.destroy();
    }
    const up = net.connect(Number(to.port), to.hostname);
    up.on("error", () => {});
    const pair: [net.Socket, net.Socket] = [down, up];
    pairs.add(pair);
    const end = () => {
      pairs.delete(pair);
      down.destroy();
      up.destroy();
    };
    down.on("close", end);
    up.on("close", end);
    down.pipe(up);
    up.pipe(down);
  });
  const cut = () => {
    isCut = true;
    for (const [down, up] of pairs) {
      dropped++;
      down.destroy();
      up.destroy();
    }
    pairs.clear();
  };
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as net.AddressInfo;
  return {
    url: `nats://127.0.0.1:${port}`,
    get dropped() {
      return dropped;
    },
    get refused() {
      return refused;
    },
    cut,
    restore() {
      isCut = false;
    },
    async close() {
      cut();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
