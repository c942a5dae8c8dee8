import { describe, expect, it } from "vitest";
import { unpack } from "../api/live";

describe("unpack", () => {
  it("numbers a chunk frame's lines and gives each its stream and time", () => {
    const lines = unpack({
      type: "logs",
      job: "j",
      first_seq: 41,
      streams: "oeo",
      times: [
        [2, 1.5],
        [1, 2.25],
      ],
      text: "loss 0.5\r\n\nwarning: é\n",
    });
    expect(lines).toEqual([
      [41, 1.5, "o", "loss 0.5\r"],
      [42, 1.5, "e", ""],
      [43, 2.25, "o", "warning: é"],
    ]);
  });
});
