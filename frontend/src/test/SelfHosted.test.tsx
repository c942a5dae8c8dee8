import { describe, expect, it } from "vitest";
import { cliInstallCommand, runnerInstallCommand } from "../lib/install";
import { registerCommand } from "../pages/SelfHosted";

describe("registerCommand", () => {
  it("is the exact command a machine registers with", () => {
    expect(registerCommand("https://ty.example.com", "tyreg_abc")).toBe(
      "trainyard-runner register --url https://ty.example.com --token tyreg_abc --work-dir /var/lib/trainyard-runner",
    );
  });
});

describe("the install lines", () => {
  it("install the runner and the CLI from the server's own wheels", () => {
    expect(runnerInstallCommand("https://ty.example.com")).toBe(
      "pip install --extra-index-url https://ty.example.com/runner/wheels/ trainyard-runner",
    );
    expect(cliInstallCommand("https://ty.example.com")).toBe(
      "pip install --extra-index-url https://ty.example.com/cli/wheels/ trainyard-cli",
    );
  });
});
