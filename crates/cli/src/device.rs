//! `--device cpu|cuda[:N]`: parsed by clap, checked against what torch sees when a command needs it.

use anyhow::anyhow;
use tch::Device;

use crate::Failure;

/// The device named on the command line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceArg(pub Device);

/// Parses `cpu`, `cuda` (= `cuda:0`) or `cuda:N`.
pub fn parse(text: &str) -> Result<DeviceArg, String> {
    let device = match text {
        "cpu" => Device::Cpu,
        "cuda" => Device::Cuda(0),
        _ => match text.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(n)) => Device::Cuda(n),
            _ => return Err(format!("expected cpu, cuda or cuda:N, got `{text}`")),
        },
    };
    Ok(DeviceArg(device))
}

impl DeviceArg {
    /// The device, after checking that torch can use it.
    pub fn resolve(self) -> Result<Device, Failure> {
        self.resolve_as("--device")
    }

    /// [`Self::resolve`] of a device named by the flag or key `what`.
    pub fn resolve_as(self, what: &str) -> Result<Device, Failure> {
        if let Device::Cuda(n) = self.0 {
            let count = tch::Cuda::device_count() as usize;
            if n >= count {
                return Err(Failure::input(anyhow!(
                    "{what} cuda:{n}: torch sees {count} CUDA device(s); use cpu{}",
                    if count > 0 {
                        " or cuda:0..cuda:".to_string() + &(count - 1).to_string()
                    } else {
                        String::new()
                    }
                )));
            }
        }
        Ok(self.0)
    }
}

/// How a device is written on the command line.
pub fn name(device: Device) -> String {
    match device {
        Device::Cuda(n) => format!("cuda:{n}"),
        other => format!("{other:?}").to_lowercase(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_device_names() {
        assert_eq!(parse("cpu").unwrap().0, Device::Cpu);
        assert_eq!(parse("cuda").unwrap().0, Device::Cuda(0));
        assert_eq!(parse("cuda:3").unwrap().0, Device::Cuda(3));
        assert!(parse("gpu").unwrap_err().contains("expected cpu, cuda or cuda:N"));
        assert!(parse("cuda:x").is_err());
    }
}
