//! The `corral` binary: the command line of [`corral_cli`] with the clouds every build knows
//! (the in-process fake); the AWS build is corral-aws's `corral-aws` binary.

fn main() -> std::process::ExitCode {
    corral_cli::main()
}
