import { describe, expect, it } from "vitest";
import { installCommand, registerCommand } from "../pages/SelfHosted";

describe("registerCommand", () => {
  it("is the exact command a machine registers with", () => {
    expect(registerCommand("https://ty.example.com", "tyreg_abc")).toBe(
      "trainyard-runner register --url https://ty.example.com --token tyreg_abc --work-dir /var/lib/trainyard-runner",
    );
  });
});

describe("installCommand", () => {
  it("installs the runner from the server's own wheels", () => {
    expect(installCommand("https://ty.example.com")).toBe(
      "pip install --extra-index-url https://ty.example.com/runner/wheels/ trainyard-runner",
    );
  });
});
