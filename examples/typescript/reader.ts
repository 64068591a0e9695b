// A reader: prints a task's projection each time its version moves forward,
// reading as contract §9 lets a confined reader (direct get and the bucket's
// subjects, no consumer). In an authenticated deployment, connect with a
// reader's credential and its inbox prefix (_INBOX_<reader>).
//
//   node dist/reader.js --servers 127.0.0.1:4222 --tasks report-1 [--until completed]
import { parseArgs } from "node:util";
import { connectReader } from "@flowness/ledger";

const { values: f } = parseArgs({
  options: {
    servers: { type: "string", default: "127.0.0.1:4222" },
    tasks: { type: "string", default: "report-1" },
    until: { type: "string" },
  },
});
const reader = await connectReader({ servers: f.servers });
const stop = new AbortController();
process.once("SIGTERM", () => stop.abort());
process.once("SIGINT", () => stop.abort());

await Promise.all(
  f.tasks!.split(",").map(async (task) => {
    for await (const v of reader.watchTask(task, { signal: stop.signal })) {
      console.log(`${task} version ${v.version} ${v.status} ${JSON.stringify(v.data)}`);
      if (f.until && v.status === f.until) break;
    }
  }),
);
await reader.close();
