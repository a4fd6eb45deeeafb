"""The digits dataset's fixed train/test split, as indices into scikit-learn's 1797 digits.

``sklearn.model_selection.train_test_split(arange(1797), test_size=0.2, stratify=target,
random_state=0)``: the 1437 training indices in the order that call returns them, then
the 360 test indices; stored here so that loading the digits needs no import of
scikit-learn (seconds on a CPU; :func:`fedjax_dp.data.datasets._load_digits` reads the
data file scikit-learn ships). ``tests/test_datasets.py`` checks it against the call.
"""

import base64
import zlib

import numpy as np

NUM_TRAIN = 1437
# uint16 little-endian, zlib-compressed, base64.
_ORDER = (
    "eNoFwQNAGAAUBcD/vppt27abbdu2rZpt1Gzbtm3btnlX1FIDCEJrryKD+QtX4rkUCKMatMFOez2cpdxaz+vQRPnJ"
    "aTFZG/tgmeM/fQ264gBl9UueG2Wpl8AqU6h35uZYolN5pjbWIv4FL1Cey0gpbcPdJANG+DH/hT3eTYl+4hwtdeG9"
    "GpUq6zjdx6k9P756N34mLXSFH+Z8fER2exx94WyT5YDP899ekopKFvsrG5GNH1N8iuJ1NQknQxjLakXsGF/geUK+"
    "Gdf9kMbUuhYZvXSWrrXxnIIre3p7TedprF6XttrDdspM1JHeWpk14DyKa3957H1QnDJpaZaARvyHF3JdPsmFrLuW"
    "5X1S0/tIDf9jMzSfnJUStMrPSTefYoU9vHW3ChasObyJreA5GlW38XSPhUlYw1NkOieQ9T5JXnFvzqbPsZmicxw7"
    "4Sk5tvdCYl6KKdqHisgLKmuD7Kbl52XazxtRYcnMn20HL7Nd+kX2WCzeJef0DgpTOSvvHZGJtuKDLtYs2p7q8SGK"
    "ZKuRURNTLc4kBbWtt+QTNsYvIKy8pJy4yomss4/mU5pYXulBzaxxaTXd1fi8mVvxMzpGbWSjndDc1NfG6GxbhTtc"
    "DJeNAuZTQuqAhzjKn+SmVJV0PtKfyie9wV28NJ3hZBzRF1IvTqpP7bmU0eg+kLdbPJtgpaSZpRBwMx/G92CS107h"
    "tK6xJlRHD0lmiiOtwd7S2sk2bNJUFNMTcojMoRB0p9hWS1NQd64na2m+FOV3vtXyWBdroKOlOnfCYvrrR3ySdbXp"
    "NoMHyAJdxWslkC7SVWsqiXHPS8hUHUvrsEhW6zsLR8vpFjWUJf5IM+gxLUapkNk/oqoxZZfwUk2iYayt54TWhQpR"
    "Ayhn83bWxoehg9WmNJRVnnorzeeBfNxfajC9ohhEdt5eWXGbI/FooU+V3r6Tl/F4uFTFJk5EafBLB+Gn7rDh3oI3"
    "WxdeowWoL88i0rV6WbtqWA2LmTzTsvh5ecsR/KI5aupv9MVJecfPYPoD+3HAKuK2BRnzNOnKlaQobaNwlkJnSRg9"
    "ZQVkvya3MlRPr2G5XLCICJYWlhfh/b301A6aW+bZNVqIfBqee/pgUty1FJ6TxlE1PkhVuZJd49EUnlJpH59O/6wJ"
    "T8QEvqhJvCAW2Fz+ah+5H/bSQ49p6X2Y5KObFJsn0HW0o6WSka8ipSbw+DIQZ/QlN6UmiK5xJYE+tmb8UKfQCCqP"
    "FVRRC/MPTWrNabG8xnnvp7tVdSmFynq9r1e1kGRCHV7rl7igX/bcXkzK8Df/QwPwW6vgCs3weH4Tl3Sbl/MCiIMa"
    "PJL+6lDdIiORnjv6GeTRYV5Zoml6TY8GMkbqQzSYP/NFGScIeItGmhGPvKNNtS4y1scinCTBR5uAEdwYJ7HV01o2"
    "OS4tpb2tsKV8GXF4kle0WVhGfTWnTOGM3soGUkSJbEO4lfexG1qKavsL3a5N/Jp/sBDeSMf5BRe0o3JUN+hMeuB3"
    "CXQOiywpOtkme07t9AbVpHJUXurKMunBmyiqtcJcPSEj5J4NokCNrJNoow5GJm5Bna2vj7F/WEVtpZl01I18VQbo"
    "DOqj91EZhVGbl2Map/Q1Up0W+1DezhUkmR/28dLehdJJM1zxGlilc6yTB3kbtObr3IGecREMMUhmWcxvKCpm2Fce"
    "otOoLQ3HDPnh1XEJG2Wgx/dpXo8iGjyWiieU1NpcjEvwb85kMZFWzlgJXJJx3oGzaymMs61ShKLbKcnOYTk5f6br"
    "+pPmcVkUl44M/ai3rBTv8l1owLtxkXdQPN1Ob2kfNaBPHkSzOYIuwin/R1Hku1eiQt5Tftl2zyO9rRC3klQ8XL9h"
    "NkWh9ZZfsvIla84TqaQG0Go+Qe8o2Db6Q5ps46mhFcdxFJRIXpEnCOteieHf7a2d4gccjePyOt+jp7Ee/eSYFONH"
    "uCK9qY0+8TyUwe/ijVWlxrIFu62KPtCc3hYXUVGe61aNIPs0xMvTSM5Bd7SXfaOD/B2vNbc1RU1M8XB8n+fwFl1E"
    "RfQXZ0ZniYRiVsv78xY7gpHWUlPaUyTTrLSFdmpdymjxNaPc40CpLWZnUVZK6G1fT7G1M2JTV1rtZ3w/9eS/dp6j"
    "oBvNxzCLJUdtMsWWwxJFyylxcc9lT6gh9/DFdo++0kmNyS9kkAy3GjbUrslTzql/cACDbYkNlCVS2HboRC7AZ+2d"
    "dpU1/kAK6H1P6p00gd1Ae41Fh2mRr+QOEg/F+Zt19xqSjRLiNp3zUxQgEbkTLUEbC0MlfLOEkXW6Sap7eRtACzW/"
    "ruOPFAG5qKRkoQDPT1X9t+yWl/aJb/ha/qY3/RBXgFNDj2+3NZLsoQUcVXLhmCmF6gmEUEQq469lHbX0AKSl5p6G"
    "c7BII1ltY7Df2lpcXynJpao+0z5cCP0pSK/ZDl9AFfi2NMRQ/EU0eoXHGoPLaxZ5jCR0n5LZDiSl2b5D8lsMvaZJ"
    "JSpv8vm6yrrgjo+hX/KI92ITLvNc74ZVktBrYYAv4XJIrpktnH6nW5LYxAI0lBZKBuuiCdBUq1EWHoKGlEsv0Ce7"
    "LNNRkMbwaBxDLSvmB6HW2EbZfE6rd6ySl/LvOo4fynNP61MxT7dZWP9APziGVfPKtl2+8Vzrx52pBaLTHYpEbk+p"
    "pr1EXAjS6Q/64G35sTS39tyTSks4zJZvspUu03FLJPtQW9/zIe9pk3k439JieoVDLLv/kdccgRLwa1stn72fPbRE"
    "vNNLWDqO5mf1mYWlYVTN0tNw+adptAjn0BX6gftSI/8hDeytl+Tl3EnG+xG7jaVaxxJrch+v93SI5+Lx1gN78FRT"
    "WQrU5LweaJG4DkJtpKxEcpyWXTTZ33hrO2TtfKlVsRQ2DwdlFE1GXNsj+ayptdb61EKa60EfbQE8wVNLUaSxcD6J"
    "I3A0G+QdJZdfpxE4wVewhL5Yfk9nJ30uHkmgzxQOuKK7uI63pq+Y6oR2WG45zZDKH1Al/SkhuoHvyUW/hU68Un+R"
    "8wKvofctkQZJS+SV2jYb27QfRfVDKCfd5RaH8cd8mw/IPr/JZ7kMtvBxSsob6B2eIDU/sgzE+KMbfKSGtUaITK3l"
    "uu2mA5xD5uA577TP+EtXfYu/0Rt2RFPbKNmJu/7ej1ATIVloiTwYQ2mdJNQIloEPo4lu5b3cy6PwV82BEXaaXnsv"
    "igH1+lbXC+lfTk2RpYC3IpYXlkFKen+/IKN8gn5AdVmG8Bhod3kUGupHX8R7uJF9QmPKyzlsg6REUz7Hn+ik7fVa"
    "tNnXWTd7wx/F/BG1l7fSwMdKf/y2iZaXklEF7Y6YlJwy+VAfh7oYrLusrEfSlhTH42oPKshHqZZUt8NWXwbxG4zW"
    "+tzfWvhxHah5uDTe6gF9btU02J/oK39v8fiXP/ODVl/n2zlbizfSQ4dpSTttZz0yf5ceckFzcyKskHSkUsZiSnSJ"
    "jS/0nXtjN0+XzprdpmEA58NR38/v9bNEx009zX2llK2XeRTFBth77KRb3l/zoKjmksZ8ktrQDRkiobxfvugTK8dp"
    "ZKVF9rGcUrZJM0oiT3iELvOy+sNK2xqqSO+ksP6mM9RM0yErSuKVTNOeyI742O9ZdTvOa0pajPr+AE09iIfTAvzj"
    "0d6RYnlEncUv5Y9Ps+U+lcJwEk0l1ZDEJnoHr8LukzSvDvZ2nNifSG/p6qX1vsSQQTpKK+GOVKHSfpV+2ntKQBN1"
    "qFSgZBKKCp6Tl+sG1LOaEgYZaabP9xXIhvD6kAtYgN2VM3KEV/oX36xTcBRpfIE8sPRyWOfKZ3Wt6Iu0qA+hrzLL"
    "siCeVPGVtNeiSSwbxVcsDl3wfz4DaTk7TddLtM9m+WzNZtW1Pf5JHq+Nl/5B/gPeg5Hb"
)


def split() -> tuple[np.ndarray, np.ndarray]:
  """``(train indices [1437], test indices [360])``."""
  order = np.frombuffer(zlib.decompress(base64.b64decode("".join(_ORDER))), "<u2").astype(np.int64)
  return order[:NUM_TRAIN], order[NUM_TRAIN:]
