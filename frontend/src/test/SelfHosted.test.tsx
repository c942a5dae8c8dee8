import { describe, expect, it } from "vitest";
import { registerCommand } from "../pages/SelfHosted";

describe("registerCommand", () => {
  it("is the exact command a machine registers with", () => {
    expect(registerCommand("https://ty.example.com", "tyreg_abc")).toBe(
      "trainyard-runner register --url https://ty.example.com --token tyreg_abc --work-dir /var/lib/trainyard-runner",
    );
  });
});
