import { describe, expect, it } from "vitest";
import { formatJson } from "../lib/jsonFormat";

describe("formatJson", () => {
  it("keeps number literals exactly as written", () => {
    expect(formatJson('{"w": 0.0, "b": 1e-3, "big": 12345678901234567890}')).toBe(
      '{\n  "w": 0.0,\n  "b": 1e-3,\n  "big": 12345678901234567890\n}',
    );
  });

  it("leaves strings with braces, commas and escapes alone", () => {
    expect(formatJson('{"a":"x, {y}: \\"z\\"","l":[1,[],{}]}')).toBe(
      '{\n  "a": "x, {y}: \\"z\\"",\n  "l": [\n    1,\n    [],\n    {}\n  ]\n}',
    );
  });

  it("returns null for text that is not JSON", () => {
    expect(formatJson("{not json")).toBeNull();
  });
});
